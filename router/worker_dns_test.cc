#include "router/worker_dns.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(ParseDnsTargetTest, HostAndPort) {
  auto t = ParseDnsTarget("tessera-worker:50061");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "tessera-worker");
  EXPECT_EQ(t->port, 50061);
  EXPECT_TRUE(ParseDnsTarget("tessera-worker.tessera.svc.cluster.local:1").ok());
}

TEST(ParseDnsTargetTest, RejectsMalformed) {
  for (const char* bad :
       {"tessera-worker", ":50061", "tessera-worker:", "tessera-worker:0", "tessera-worker:70000",
        "tessera-worker:x", "[::1]:50061", "dns:///tessera-worker:50061"}) {
    EXPECT_EQ(ParseDnsTarget(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ResolveWorkersTest, SortedUniqueWithPortAndBracketedV6) {
  DnsLookup lookup = [](const std::string& host) -> absl::StatusOr<std::vector<std::string>> {
    EXPECT_EQ(host, "w");
    return std::vector<std::string>{"10.0.0.9", "fd00::7", "10.0.0.10", "10.0.0.9"};
  };
  auto w = ResolveWorkers({"w", 50061}, lookup);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(*w, ElementsAre("10.0.0.10:50061", "10.0.0.9:50061", "[fd00::7]:50061"));
}

TEST(ResolveWorkersTest, NoSuchNameIsEmptyOtherFailuresAreErrors) {
  auto none =
      ResolveWorkers({"w", 1}, [](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
        return absl::NotFoundError("NXDOMAIN");
      });
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
  auto down =
      ResolveWorkers({"w", 1}, [](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
        return absl::UnavailableError("no answer");
      });
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
}

TEST(SystemDnsLookupTest, ResolvesLocalhostAndNotAMissingName) {
  auto local = ResolveWorkers({"localhost", 50061}, SystemDnsLookup);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_THAT(*local, Contains("127.0.0.1:50061"));
  // .invalid never resolves (RFC 6761); without network the lookup may
  // fail instead of answering NXDOMAIN, but it must not give addresses.
  auto missing = ResolveWorkers({"no-such-worker.invalid", 1}, SystemDnsLookup);
  if (missing.ok()) {
    EXPECT_THAT(*missing, IsEmpty());
  }
}

// A DNS answer the test changes, and the lists the watcher reported.
class FakeDns {
 public:
  void Set(absl::StatusOr<std::vector<std::string>> answer) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(answer);
    lookups_at_set_ = lookups_;
  }
  DnsLookup Lookup() {
    return [this](const std::string&) {
      absl::MutexLock lock(&mu_);
      ++lookups_;
      return answer_;
    };
  }
  WorkerDnsWatcher::Callback Callback() {
    return [this](const std::vector<std::string>& w) {
      absl::MutexLock lock(&mu_);
      reports_.push_back(w);
    };
  }
  // Waits until the watcher looked up `n` more times since the last Set.
  bool WaitLookups(int n) {
    absl::MutexLock lock(&mu_);
    want_ = n;
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](FakeDns* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                      return d->lookups_ - d->lookups_at_set_ >= d->want_;
                                    },
                                    this),
                                absl::Seconds(10));
  }
  std::vector<std::vector<std::string>> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  absl::Mutex mu_;
  absl::StatusOr<std::vector<std::string>> answer_ ABSL_GUARDED_BY(mu_) =
      std::vector<std::string>{};
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int lookups_at_set_ ABSL_GUARDED_BY(mu_) = 0;
  int want_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<std::string>> reports_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerDnsWatcherTest, ReportsChangesOnlyAndKeepsTheListWhenDnsFails) {
  FakeDns dns;
  dns.Set(std::vector<std::string>{"10.0.0.1"});
  WorkerDnsWatcher watcher({{"w", 7}, absl::Milliseconds(5)}, dns.Lookup(), dns.Callback());
  ASSERT_TRUE(watcher.Start().ok());
  // Start() looked up once and reported synchronously.
  EXPECT_THAT(dns.reports(), ElementsAre(ElementsAre("10.0.0.1:7")));
  ASSERT_TRUE(dns.WaitLookups(3));  // same answer: no new report
  EXPECT_EQ(dns.reports().size(), 1u);

  dns.Set(std::vector<std::string>{"10.0.0.2", "10.0.0.1"});  // scaled up
  ASSERT_TRUE(dns.WaitLookups(2));
  dns.Set(absl::UnavailableError("DNS down"));  // kept
  ASSERT_TRUE(dns.WaitLookups(3));
  dns.Set(absl::NotFoundError("NXDOMAIN"));  // scaled to zero
  ASSERT_TRUE(dns.WaitLookups(2));
  watcher.Stop();
  EXPECT_THAT(dns.reports(), ElementsAre(ElementsAre("10.0.0.1:7"),
                                         ElementsAre("10.0.0.1:7", "10.0.0.2:7"), IsEmpty()));
}

TEST(WorkerDnsWatcherTest, FirstLookupFailureIsReturnedAndRetried) {
  FakeDns dns;
  dns.Set(absl::UnavailableError("not yet"));
  WorkerDnsWatcher watcher({{"w", 7}, absl::Milliseconds(5)}, dns.Lookup(), dns.Callback());
  EXPECT_EQ(watcher.Start().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(dns.reports(), IsEmpty());
  dns.Set(std::vector<std::string>{"10.0.0.3"});
  ASSERT_TRUE(dns.WaitLookups(1));
  watcher.Stop();
  EXPECT_THAT(dns.reports(), ElementsAre(ElementsAre("10.0.0.3:7")));
}

TEST(WorkerDnsWatcherTest, StopEndsALongIntervalAtOnce) {
  FakeDns dns;
  WorkerDnsWatcher watcher({{"w", 7}, absl::Hours(1)}, dns.Lookup(), dns.Callback());
  ASSERT_TRUE(watcher.Start().ok());
  const absl::Time t0 = absl::Now();
  watcher.Stop();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_THAT(dns.reports(), ElementsAre(IsEmpty()));
}

}  // namespace
}  // namespace tessera::router
