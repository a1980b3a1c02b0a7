// The clients in examples/ run against a real router and scripted
// simulated workers (chat_fixture.h): the official `openai` npm client over
// HTTP (examples/openai_node) and a Python gRPC client with stubs generated
// by protoc at run time (examples/python_grpc), each with --check; and the
// npm client's seed checks (seeded.mjs) against the trained models/target.
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/chat_fixture.h"

namespace tessera::testing {
namespace {

std::string Source() {
  const char* s = std::getenv("TESSERA_SOURCE_DIR");
  return s ? s : ".";
}

// Runs `command`, its output into the test log; its exit status.
int RunCommand(const std::string& command) {
  const int rc = std::system((command + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ExamplesTest, OpenAiNodeClient) {
  ChatCluster c = StartChatCluster();
  const char* bin = std::getenv("TESSERA_BINARY_DIR");
  const std::string work = absl::StrCat(bin ? bin : ".", "/examples_openai_node");
  EXPECT_EQ(
      RunCommand(absl::StrCat("TESSERA_BASE_URL=http://127.0.0.1:", c.http_port(), "/v1 bash ",
                              Source(), "/examples/openai_node/run.sh ", work, " --check")),
      0);
}

// Seeds against a model whose distribution they change: the trained
// models/target on one CPU worker (the scripted model above answers alike
// whatever the seed, so it cannot show a seed doing anything).
TEST(ExamplesTest, OpenAiNodeSeedsOnTheTrainedModel) {
  const std::string model = absl::StrCat(Source(), "/models/target");
  Cluster c = StartCluster(1, {"--model=" + model, "--cpu_threads=1"},
                           {"--tokenizer=" + model, "--http_listen=127.0.0.1:0"});
  ASSERT_GT(c.router.http_port, 0);
  const char* bin = std::getenv("TESSERA_BINARY_DIR");
  const std::string work = absl::StrCat(bin ? bin : ".", "/examples_openai_node");
  EXPECT_EQ(
      RunCommand(absl::StrCat("TESSERA_BASE_URL=http://127.0.0.1:", c.router.http_port, "/v1 bash ",
                              Source(), "/examples/openai_node/run.sh ", work, " seeded.mjs")),
      0);
}

TEST(ExamplesTest, PythonGrpcClient) {
  ChatCluster c = StartChatCluster();
  EXPECT_EQ(RunCommand(absl::StrCat("TESSERA_GRPC=127.0.0.1:", c.cluster.router.grpc_port, " bash ",
                                    Source(), "/examples/python_grpc/run.sh --check")),
            0);
}

}  // namespace
}  // namespace tessera::testing
