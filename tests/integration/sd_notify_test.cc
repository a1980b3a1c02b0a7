// The systemd notification protocol (Type=notify) against a socket the test
// listens on: READY=1 only once the worker is ready (model loaded, warm-up
// passed), WATCHDOG=1 pings at half of WATCHDOG_USEC, STOPPING=1 when the
// drain starts, and a STATUS line when start-up fails.
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{0, 200000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~NotifySocket() { close(fd_); }
  // Collects messages until one contains `want` or the timeout passes.
  bool WaitFor(const std::string& want, absl::Duration timeout) {
    absl::Time until = absl::Now() + timeout;
    char buf[4096];
    while (absl::Now() < until) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      messages_.emplace_back(buf, n);
      if (messages_.back().find(want) != std::string::npos) return true;
    }
    return false;
  }
  int Count(const std::string& what) const {
    int c = 0;
    for (const std::string& m : messages_) c += m.find(what) != std::string::npos;
    return c;
  }
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<std::string> messages_;
};

std::string Fixture() {
  return absl::StrCat(std::getenv("TESSERA_SOURCE_DIR"), "/tests/fixtures/models/qwen3_tiny");
}

TEST(SdNotifyTest, ReadyWatchdogAndStopping) {
  std::string dir = MakeTempDir();
  NotifySocket sock(dir + "/notify");
  setenv("NOTIFY_SOCKET", (dir + "/notify").c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);
  TestProcess worker;
  ASSERT_TRUE(worker
                  .Start(BinaryPath("services/worker/tessera-worker"),
                         {"--model=" + Fixture(), "--listen=127.0.0.1:0", "--metrics_listen=",
                          "--port_file=" + dir + "/ports", "--drain_grace=100ms"},
                         dir + "/log")
                  .ok());
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(sock.WaitFor("READY=1", absl::Seconds(30))) << worker.ReadLog();
  // When READY=1 arrives the service is ready already.
  auto ports = worker.WaitForPortFile(dir + "/ports", absl::Seconds(5));
  ASSERT_TRUE(ports.ok());
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*ports)["grpc_port"]), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("tessera.v1.Worker");
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // Pings at ~100 ms.
  absl::SleepFor(absl::Milliseconds(600));
  sock.WaitFor("never", absl::Milliseconds(300));
  EXPECT_GE(sock.Count("WATCHDOG=1"), 3);
  worker.Signal(SIGTERM);
  EXPECT_TRUE(sock.WaitFor("STOPPING=1", absl::Seconds(10)));
  auto exit = worker.Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0);
}

TEST(SdNotifyTest, StartupFailureIsReportedAsStatus) {
  std::string dir = MakeTempDir();
  NotifySocket sock(dir + "/notify");
  setenv("NOTIFY_SOCKET", (dir + "/notify").c_str(), 1);
  TestProcess worker;
  ASSERT_TRUE(worker
                  .Start(BinaryPath("services/worker/tessera-worker"),
                         {"--model=/nonexistent/model", "--listen=127.0.0.1:0"}, dir + "/log")
                  .ok());
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(sock.WaitFor("STATUS=start-up failed", absl::Seconds(20)));
  EXPECT_EQ(sock.Count("READY=1"), 0);
  auto exit = worker.Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_NE(exit->code, 0);
}

}  // namespace
}  // namespace tessera::testing
