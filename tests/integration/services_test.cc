// End-to-end checks of the three service binaries: health, reflection,
// metrics, drain on SIGTERM and start-up errors. Every test starts the real
// binaries on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace tessera::testing
