// `tessera health`: asks a service's grpc.health.v1 for its status; exits 0
// when SERVING. Usable in scripts and as a probe.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "services/cli/commands.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "health: the service's host:port");
ABSL_FLAG(std::string, service, "", "health: service name; empty = the whole server (liveness)");
ABSL_FLAG(absl::Duration, wait, absl::ZeroDuration(),
          "health: keep asking until SERVING or this much time has passed");

namespace tessera::cli {

int RunHealth(const std::vector<char*>&) {
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  absl::Time until = absl::Now() + absl::GetFlag(FLAGS_wait);
  std::string last = "no answer";
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    HealthCheckRequest req;
    req.set_service(absl::GetFlag(FLAGS_service));
    HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    if (s.ok()) {
      last = HealthCheckResponse::ServingStatus_Name(resp.status());
      if (resp.status() == HealthCheckResponse::SERVING) {
        std::printf("%s %s: SERVING\n", absl::GetFlag(FLAGS_target).c_str(),
                    absl::GetFlag(FLAGS_service).c_str());
        return 0;
      }
    } else {
      last = s.error_message();
    }
    if (absl::Now() < until) absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < until);
  std::fprintf(stderr, "%s %s: %s\n", absl::GetFlag(FLAGS_target).c_str(),
               absl::GetFlag(FLAGS_service).c_str(), last.c_str());
  return 1;
}

}  // namespace tessera::cli
