// End-to-end checks of the three service binaries: health, reflection,
// metrics, drain on SIGTERM and start-up errors, and `tessera up`
// restarting a worker that failed for good. Every test starts the real
// binaries on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "services/common/exit_codes.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "tessera/v1/worker.grpc.pb.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;
using ::testing::Not;

struct ServiceSpec {
  std::string binary;
  std::string service_name;
  std::vector<std::string> args;  // what the binary needs to start
};

std::string FixtureModel() {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/qwen3_tiny");
}

const ServiceSpec kServices[] = {
    {"services/worker/tessera-worker", "tessera.v1.Worker", {"--model=" + FixtureModel()}},
    // A worker address nothing listens on: the router still serves (requests
    // would get UNAVAILABLE).
    {"services/router/tessera-router", "tessera.v1.Inference", {"--workers=127.0.0.1:1"}},
    {"services/drafter/tessera-drafter", "tessera.v1.Drafter", {}},
};

// A started service with its ports and a channel to it.
struct Running {
  std::unique_ptr<TestProcess> process;
  int grpc_port = 0;
  int metrics_port = 0;
  std::shared_ptr<grpc::Channel> channel;
};

Running StartService(const ServiceSpec& spec, std::vector<std::string> extra_args = {}) {
  Running r;
  std::string dir = MakeTempDir();
  std::string port_file = dir + "/ports";
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                   "--port_file=" + port_file};
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  r.process = std::make_unique<TestProcess>();
  EXPECT_TRUE(r.process->Start(BinaryPath(spec.binary), args, dir + "/log").ok());
  auto ports = r.process->WaitForPortFile(port_file, absl::Seconds(20));
  EXPECT_TRUE(ports.ok()) << ports.status();
  if (!ports.ok()) return r;
  r.grpc_port = (*ports)["grpc_port"];
  r.metrics_port = (*ports)["metrics_port"];
  r.channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", r.grpc_port),
                                  grpc::InsecureChannelCredentials());
  return r;
}

HealthCheckResponse::ServingStatus Check(grpc::Channel* channel, const std::string& service,
                                         grpc::Status* status_out = nullptr) {
  auto stub = Health::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (status_out) *status_out = s;
  return s.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
}

HealthCheckResponse::ServingStatus WaitForStatus(grpc::Channel* channel, const std::string& service,
                                                 HealthCheckResponse::ServingStatus want,
                                                 absl::Duration timeout) {
  absl::Time until = absl::Now() + timeout;
  HealthCheckResponse::ServingStatus got = HealthCheckResponse::UNKNOWN;
  while (absl::Now() < until) {
    got = Check(channel, service);
    if (got == want) return got;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return got;
}

std::vector<std::string> ListServices(grpc::Channel* channel) {
  using grpc::reflection::v1alpha::ServerReflection;
  using grpc::reflection::v1alpha::ServerReflectionRequest;
  using grpc::reflection::v1alpha::ServerReflectionResponse;
  auto stub =
      ServerReflection::NewStub(std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&ctx);
  ServerReflectionRequest req;
  req.set_list_services("*");
  std::vector<std::string> names;
  if (!stream->Write(req)) return names;
  stream->WritesDone();
  ServerReflectionResponse resp;
  while (stream->Read(&resp)) {
    for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  }
  stream->Finish();
  return names;
}

TEST(ServicesTest, EachBinaryIsHealthyReflectsAndServesMetrics) {
  for (const ServiceSpec& spec : kServices) {
    SCOPED_TRACE(spec.binary);
    Running r = StartService(spec);
    ASSERT_TRUE(r.channel);
    EXPECT_EQ(WaitForStatus(r.channel.get(), "", HealthCheckResponse::SERVING, absl::Seconds(10)),
              HealthCheckResponse::SERVING);
    EXPECT_EQ(WaitForStatus(r.channel.get(), spec.service_name, HealthCheckResponse::SERVING,
                            absl::Seconds(10)),
              HealthCheckResponse::SERVING);
    grpc::Status unknown_status;
    Check(r.channel.get(), "no.such.Service", &unknown_status);
    EXPECT_EQ(unknown_status.error_code(), grpc::StatusCode::NOT_FOUND);

    std::vector<std::string> services = ListServices(r.channel.get());
    EXPECT_THAT(services, ::testing::Contains(spec.service_name));
    EXPECT_THAT(services, ::testing::Contains("grpc.health.v1.Health"));

    auto metrics = HttpGet(r.metrics_port, "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_THAT(*metrics, HasSubstr("tessera_build_info{"));
    EXPECT_THAT(*metrics, HasSubstr("tessera_service_ready"));

    r.process->Signal(SIGTERM);
    auto exit = r.process->Wait(absl::Seconds(20));
    ASSERT_TRUE(exit.has_value()) << r.process->ReadLog();
    EXPECT_TRUE(exit->exited);
    EXPECT_EQ(exit->code, 0) << r.process->ReadLog();
  }
}

TEST(ServicesTest, ReadinessIsNotServingWhileDraining) {
  for (const ServiceSpec& spec : kServices) {
    SCOPED_TRACE(spec.binary);
    Running r = StartService(spec, {"--drain_grace=3s"});
    ASSERT_TRUE(r.channel);
    ASSERT_EQ(WaitForStatus(r.channel.get(), spec.service_name, HealthCheckResponse::SERVING,
                            absl::Seconds(10)),
              HealthCheckResponse::SERVING);
    r.process->Signal(SIGTERM);
    // During the grace period the server still answers, with NOT_SERVING
    // for readiness and SERVING for liveness.
    EXPECT_EQ(WaitForStatus(r.channel.get(), spec.service_name, HealthCheckResponse::NOT_SERVING,
                            absl::Seconds(2)),
              HealthCheckResponse::NOT_SERVING);
    EXPECT_EQ(Check(r.channel.get(), ""), HealthCheckResponse::SERVING);
    auto exit = r.process->Wait(absl::Seconds(20));
    ASSERT_TRUE(exit.has_value());
    EXPECT_TRUE(exit->exited);
    EXPECT_EQ(exit->code, 0) << r.process->ReadLog();
  }
}

TEST(ServicesTest, SigtermLetsAnOpenStreamFinishAndExitsZero) {
  Running r = StartService(kServices[0], {"--drain_grace=500ms", "--drain_deadline=10s"});
  ASSERT_TRUE(r.channel);
  ASSERT_EQ(WaitForStatus(r.channel.get(), "tessera.v1.Worker", HealthCheckResponse::SERVING,
                          absl::Seconds(10)),
            HealthCheckResponse::SERVING);

  // A health Watch sees the readiness change as it happens.
  auto health = Health::NewStub(r.channel);
  grpc::ClientContext watch_ctx;
  HealthCheckRequest watch_req;
  watch_req.set_service("tessera.v1.Worker");
  auto watch = health->Watch(&watch_ctx, watch_req);
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  auto worker = tessera::v1::Worker::NewStub(r.channel);
  grpc::ClientContext load_ctx;
  tessera::v1::WatchLoadRequest load_req;
  load_req.set_interval_ms(50);
  auto load = worker->WatchLoad(&load_ctx, load_req);
  tessera::v1::LoadReport report;
  ASSERT_TRUE(load->Read(&report));
  EXPECT_FALSE(report.draining());

  r.process->Signal(SIGTERM);
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);

  // The load stream keeps reporting through the drain, then finishes.
  bool saw_draining = false;
  uint64_t last_sequence = report.sequence();
  while (load->Read(&report)) {
    EXPECT_EQ(report.sequence(), last_sequence + 1);
    last_sequence = report.sequence();
    saw_draining |= report.draining();
  }
  grpc::Status load_status = load->Finish();
  EXPECT_TRUE(saw_draining);
  EXPECT_TRUE(load_status.ok()) << load_status.error_message();

  auto exit = r.process->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0) << r.process->ReadLog();
  watch_ctx.TryCancel();
}

TEST(ServicesTest, DrainRpcRefusesNewWorkAndStopsTheWorker) {
  Running r = StartService(kServices[0], {"--drain_grace=2s"});
  ASSERT_TRUE(r.channel);
  auto worker = tessera::v1::Worker::NewStub(r.channel);
  {
    grpc::ClientContext ctx;
    tessera::v1::DrainRequest req;
    req.set_deadline_ms(5000);
    tessera::v1::DrainResponse resp;
    ASSERT_TRUE(worker->Drain(&ctx, req, &resp).ok());
  }
  // Still inside the grace period: Generate is refused as draining.
  grpc::ClientContext ctx;
  tessera::v1::WorkerGenerateRequest req;
  req.add_prompt_ids(1);
  auto stream = worker->Generate(&ctx, req);
  tessera::v1::WorkerGenerateResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("draining"));
  auto exit = r.process->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0);
}

// A start-up error must be one clear line and a non-zero exit, not a crash.
void ExpectStartupError(const ServiceSpec& spec, std::vector<std::string> args,
                        const std::string& expected_text) {
  args.insert(args.begin(), spec.args.begin(), spec.args.end());
  auto result = RunToCompletion(BinaryPath(spec.binary), args, absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->exit.exited) << "killed by signal " << result->exit.signal;
  EXPECT_NE(result->exit.code, 0);
  EXPECT_THAT(result->output, HasSubstr(expected_text));
  EXPECT_THAT(result->output, Not(HasSubstr("terminate called")));
  EXPECT_THAT(result->output, Not(HasSubstr("Aborted")));
}

TEST(ServicesTest, BadFlagsGiveOneLineErrors) {
  const ServiceSpec& worker = kServices[0];
  ExpectStartupError(worker, {"--attention_backend=warpspeed"},
                     "--attention_backend=warpspeed: unknown backend; valid choices: auto");
  ExpectStartupError(worker, {"--no_such_flag=1"}, "Unknown command line flag 'no_such_flag'");
  ExpectStartupError(worker, {"--tls_cert=/nonexistent/cert.pem", "--tls_key=/nonexistent/k.pem"},
                     "--tls_cert=/nonexistent/cert.pem: No such file or directory");
  ExpectStartupError(worker, {"--tensor_parallel_size=0"}, "--tensor_parallel_size=0");
  ExpectStartupError({worker.binary, worker.service_name, {}}, {}, "--model is required");
  ExpectStartupError({worker.binary, worker.service_name, {"--model=/nonexistent/model"}}, {},
                     "/nonexistent/model");

  // A port held by another socket.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string busy = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  for (const ServiceSpec& spec : kServices) {
    ExpectStartupError(spec, {"--listen=" + busy}, "cannot listen on " + busy);
    ExpectStartupError(spec, {"--metrics_listen=" + busy}, "cannot serve metrics on " + busy);
  }
  close(fd);
}

// The whole of a file ("" when it cannot be read).
std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `path` until it contains `text`; returns its last contents.
std::string WaitForText(const std::string& path, const std::string& text, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  std::string got = ReadWhole(path);
  while (got.find(text) == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
    got = ReadWhole(path);
  }
  return got;
}

// The router address `tessera up` prints once the cluster is ready ("" if
// it did not within 60 s).
std::string UpRouterAddress(const std::string& up_out) {
  const std::string started = WaitForText(up_out, "\nrouter=", absl::Seconds(60));
  const size_t at = started.find("\nrouter=");
  if (at == std::string::npos) return "";
  return started.substr(at + 8, started.find('\n', at + 1) - at - 8);
}

// A greedy stream of `max_tokens` after the prompt 5 6 7 (30 s deadline);
// *tokens counts what arrived.
grpc::Status GenerateFiveSixSeven(tessera::v1::Inference::Stub* stub, int max_tokens, int* tokens) {
  tessera::v1::GenerateRequest req;
  for (int32_t t : {5, 6, 7}) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->Generate(&ctx, req);
  tessera::v1::GenerateResponse resp;
  *tokens = 0;
  while (reader->Read(&resp)) *tokens += resp.chunk().token_ids_size();
  return reader->Finish();
}

// `tessera up` with one simulated worker that breaks for good after a few
// steps: the worker exits with kExitServiceFailed, `up` starts it again on
// its ports, the router finds it there and serves again, and Ctrl-C still
// stops the cluster cleanly.
TEST(ServicesTest, UpRestartsAWorkerWhoseModelRunnerFailedOnItsPorts) {
  const std::string dir = MakeTempDir();
  TestProcess up;
  // 12 steps: the warm-up, then a prefill and 10 decode steps.
  ASSERT_TRUE(up.Start(BinaryPath("services/cli/tessera"),
                       {"up", "--workers=1", "--run_dir=" + dir,
                        "--up_simulate=vocab=512,context=4096,decode_step_us=1000,"
                        "fail_after_steps=12"},
                       dir + "/up.out")
                  .ok());
  const std::string router = UpRouterAddress(dir + "/up.out");
  ASSERT_FALSE(router.empty()) << ReadWhole(dir + "/up.out");
  auto stub = tessera::v1::Inference::NewStub(
      grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  auto generate = [&](int max_tokens, int* tokens) {
    return GenerateFiveSixSeven(stub.get(), max_tokens, tokens);
  };
  int tokens = 0;
  // Breaks the worker: no other worker to resume on, so the stream fails.
  grpc::Status broken = generate(40, &tokens);
  EXPECT_FALSE(broken.ok());
  EXPECT_EQ(tokens, 11);  // the prefill's token and ten decode steps'
  const std::string restarted = WaitForText(
      dir + "/up.out", absl::StrCat("worker-0 exited with code ", services::kExitServiceFailed),
      absl::Seconds(30));
  EXPECT_THAT(restarted, HasSubstr("restarting it on port"));
  // Served again once the router sees the new process ready.
  grpc::Status again;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  do {
    absl::SleepFor(absl::Milliseconds(100));
    again = generate(4, &tokens);
  } while (!again.ok() && absl::Now() < until);
  EXPECT_TRUE(again.ok()) << again.error_message() << "\n" << ReadWhole(dir + "/up.out");
  EXPECT_EQ(tokens, 4);
  up.Signal(SIGINT);
  auto exit = up.Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << ReadWhole(dir + "/up.out");
  // Both processes' output is in the worker's log.
  EXPECT_THAT(ReadWhole(dir + "/worker-0.log"), HasSubstr("the service failed for good"));
}

// The pid of the process whose command line holds `needle` (one this test
// started, found by its unique run directory), or -1.
pid_t FindProcess(const std::string& needle) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::string cmdline = ReadWhole(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// `tessera up` restarts a worker that a signal killed (a crash, the OOM
// killer, kill -9) on its ports, as it does one that exits with
// kExitServiceFailed; the router serves through it again.
TEST(ServicesTest, UpRestartsAWorkerKilledByASignal) {
  const std::string dir = MakeTempDir();
  TestProcess up;
  ASSERT_TRUE(up.Start(BinaryPath("services/cli/tessera"),
                       {"up", "--workers=1", "--run_dir=" + dir,
                        "--up_simulate=vocab=512,context=4096,decode_step_us=1000"},
                       dir + "/up.out")
                  .ok());
  const std::string router = UpRouterAddress(dir + "/up.out");
  ASSERT_FALSE(router.empty()) << ReadWhole(dir + "/up.out");
  auto stub = tessera::v1::Inference::NewStub(
      grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  auto generate = [&] {
    int tokens = 0;
    return GenerateFiveSixSeven(stub.get(), 4, &tokens);
  };
  ASSERT_TRUE(generate().ok());
  const pid_t worker = FindProcess("--port_file=" + dir + "/worker-0.ports");
  ASSERT_GT(worker, 0);
  kill(worker, SIGKILL);
  const std::string restarted =
      WaitForText(dir + "/up.out", "worker-0 was killed by signal 9", absl::Seconds(30));
  EXPECT_THAT(restarted, HasSubstr("restarting it on port"));
  grpc::Status again;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  do {
    absl::SleepFor(absl::Milliseconds(100));
    again = generate();
  } while (!again.ok() && absl::Now() < until);
  EXPECT_TRUE(again.ok()) << again.error_message() << "\n" << ReadWhole(dir + "/up.out");
  const pid_t second = FindProcess("--port_file=" + dir + "/worker-0.ports");
  EXPECT_GT(second, 0);
  EXPECT_NE(second, worker);
  up.Signal(SIGINT);
  auto exit = up.Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << ReadWhole(dir + "/up.out");
}

}  // namespace
}  // namespace tessera::testing
