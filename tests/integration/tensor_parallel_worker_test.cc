// The real tessera-worker binary with --tensor_parallel_size on CPU ranks:
// two ranks serve the fixture model and reproduce transformers' greedy
// continuations over gRPC, GetInfo reports the ranks, and sizes that do not
// divide the model's heads stop the worker at start-up with a one-line error.
#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tessera/v1/worker.grpc.pb.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

using tessera::v1::Worker;
using ::testing::HasSubstr;
using ::testing::Not;

std::string SourcePath(const std::string& rel) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/", rel);
}

TEST(TensorParallelWorkerTest, TwoCpuRanksMatchTransformersGreedy) {
  const std::string model = SourcePath("tests/fixtures/models/llama3_tiny");
  std::ifstream in(model + "/expected.json");
  ASSERT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(ss.str());

  const std::string dir = MakeTempDir();
  TestProcess worker;
  ASSERT_TRUE(
      worker
          .Start(BinaryPath("services/worker/tessera-worker"),
                 {"--model=" + model, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                  "--port_file=" + dir + "/ports", "--drain_grace=100ms",
                  "--tensor_parallel_size=2", "--cpu_threads=2", "--kv_cache_blocks=64"},
                 dir + "/log")
          .ok());
  auto ports = worker.WaitForPortFile(dir + "/ports", absl::Seconds(30));
  ASSERT_TRUE(ports.ok()) << ports.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*ports)["grpc_port"]),
                                     grpc::InsecureChannelCredentials());
  auto stub = Worker::NewStub(channel);
  tessera::v1::WorkerInfo info;
  for (absl::Time until = absl::Now() + absl::Seconds(60); absl::Now() < until;) {
    grpc::ClientContext ctx;
    if (stub->GetInfo(&ctx, {}, &info).ok() && info.ready()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(info.ready()) << worker.ReadLog();
  EXPECT_EQ(info.tensor_parallel_size(), 2);

  const auto& prompts = expected["prompts"];
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE(absl::StrCat("prompt ", p));
    const auto want = expected["greedy_continuations"][p].get<std::vector<int32_t>>();
    tessera::v1::WorkerGenerateRequest req;
    for (int32_t t : prompts[p].get<std::vector<int32_t>>()) req.add_prompt_ids(t);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(static_cast<int>(want.size()));
    req.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&ctx, req);
    std::vector<int32_t> got;
    tessera::v1::WorkerGenerateResponse resp;
    while (reader->Read(&resp)) {
      for (int32_t t : resp.chunk().token_ids()) got.push_back(t);
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(got, want);
  }
  worker.Signal(SIGTERM);
  auto exit = worker.Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
}

TEST(TensorParallelWorkerTest, IndivisibleSizeIsAStartupError) {
  auto result = RunToCompletion(
      BinaryPath("services/worker/tessera-worker"),
      {"--model=" + SourcePath("tests/fixtures/models/qwen3_tiny"), "--listen=127.0.0.1:0",
       "--metrics_listen=127.0.0.1:0", "--tensor_parallel_size=3"},
      absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->exit.exited);
  EXPECT_NE(result->exit.code, 0);
  EXPECT_THAT(result->output,
              HasSubstr("--tensor_parallel_size=3: the model's 4 attention heads do not divide "
                        "into 3 ranks"));
  EXPECT_THAT(result->output, Not(HasSubstr("terminate called")));
}

}  // namespace
}  // namespace tessera::testing
