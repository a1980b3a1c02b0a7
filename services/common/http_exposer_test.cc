// HttpExposer on loopback: the page at /metrics, 404 and 405 for the rest,
// a malformed request dropped, idle peers cut at the request deadline, and
// connections beyond kMaxConnections closed at once.
#include "services/common/http_exposer.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_process.h"

namespace tessera::services {
namespace {

using testing::ConnectLoopback;
using ::testing::HasSubstr;
using testing::HttpGet;

// Sends `request` on a fresh connection and returns all it gets back.
std::string Exchange(int port, const std::string& request) {
  absl::StatusOr<int> fd = ConnectLoopback(port);
  if (!fd.ok()) return "";
  (void)!write(*fd, request.data(), request.size());
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(*fd, buf, sizeof(buf))) > 0) got.append(buf, n);
  close(*fd);
  return got;
}

TEST(HttpExposerTest, ServesMetricsAndRefusesTheRest) {
  auto exposer = HttpExposer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const int port = (*exposer)->port();
  ASSERT_GT(port, 0);
  auto body = HttpGet(port, "/metrics?x=1");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "up 1\n");
  EXPECT_THAT(Exchange(port, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n"), HasSubstr(" 404 "));
  EXPECT_THAT(Exchange(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
              HasSubstr(" 405 "));
  EXPECT_EQ(Exchange(port, "NOT HTTP AT ALL\r\n\r\n"), "");  // dropped, no answer
}

TEST(HttpExposerTest, BindFailureNamesTheAddress) {
  auto first = HttpExposer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(first.ok());
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = HttpExposer::Start(taken, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
  EXPECT_FALSE(HttpExposer::Start("no-port", [] { return std::string(); }).ok());
}

TEST(HttpExposerTest, ConnectionsBeyondTheCapAreClosedAndIdleOnesCut) {
  auto exposer = HttpExposer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(exposer.ok());
  const int port = (*exposer)->port();
  std::vector<int> idle;
  for (int i = 0; i < HttpExposer::kMaxConnections; ++i) {
    absl::StatusOr<int> fd = ConnectLoopback(port);
    ASSERT_TRUE(fd.ok()) << fd.status();
    idle.push_back(*fd);
  }
  // The cap is reached once the server has taken them all: a scrape then
  // gets its connection closed, until the deadline cuts the idle ones.
  const absl::Time start = absl::Now();
  bool refused = false, served_again = false;
  while (absl::Now() - start < absl::Seconds(10) && !served_again) {
    const bool ok = HttpGet(port, "/metrics").ok();
    refused |= !ok;
    served_again = refused && ok;
    if (!served_again) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(refused) << "a scrape beyond the cap was served";
  EXPECT_TRUE(served_again) << "the idle connections were not cut";
  EXPECT_GE(absl::Now() - start, HttpExposer::kRequestDeadline - absl::Milliseconds(500));
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace tessera::services
