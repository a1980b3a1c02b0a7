#include "router/worker_registry.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

using ::testing::ElementsAre;

class RegistryTest : public ::testing::Test {
 protected:
  RegistryOptions Options() {
    RegistryOptions o;
    o.max_workers = 8;
    o.failures_to_eject = 3;
    o.base_ejection = absl::Seconds(1);
    o.max_ejection = absl::Seconds(5);
    o.ejection_multiplier = 2.0;
    o.max_ejected_percent = 100;
    o.load_staleness = absl::Seconds(2);
    return o;
  }

  // Adds a serving worker that has reported load.
  WorkerRef AddServing(WorkerRegistry& r, const std::string& id) {
    absl::StatusOr<WorkerRef> ref = r.Add(id);
    EXPECT_TRUE(ref.ok()) << ref.status();
    EXPECT_TRUE(r.SetHealth(id, HealthState::kServing).ok());
    EXPECT_TRUE(r.ReportLoad(id, WorkerLoad{}, 0, false).ok());
    return *ref;
  }

  Unroutable Why(const WorkerRegistry& r, const std::string& id) {
    std::optional<WorkerStatus> s = r.StatusOf(id);
    EXPECT_TRUE(s.has_value());
    return s.has_value() ? s->unroutable : Unroutable::kNone;
  }

  FakeClock clock_;
};

TEST_F(RegistryTest, AddRemoveAndSlotReuse) {
  WorkerRegistry r(Options(), 16, &clock_);
  absl::StatusOr<WorkerRef> a = r.Add("a:1");
  absl::StatusOr<WorkerRef> b = r.Add("b:1");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->slot, b->slot);
  EXPECT_EQ(r.Add("a:1").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Add("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.size(), 2u);

  std::optional<WorkerRef> removed = r.Remove("a:1");
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(*removed, *a);
  EXPECT_FALSE(r.Remove("a:1").has_value());
  absl::StatusOr<WorkerRef> c = r.Add("c:1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->slot, a->slot);                // the slot is reused...
  EXPECT_NE(c->incarnation, a->incarnation);  // ...by a new incarnation
}

TEST_F(RegistryTest, FullRegistryRefusesWithResourceExhausted) {
  RegistryOptions o = Options();
  o.max_workers = 2;
  WorkerRegistry r(o, 16, &clock_);
  ASSERT_TRUE(r.Add("a").ok());
  ASSERT_TRUE(r.Add("b").ok());
  EXPECT_EQ(r.Add("c").status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(RegistryTest, ReconcileAddsNewRemovesGoneIgnoresDuplicates) {
  WorkerRegistry r(Options(), 16, &clock_);
  ReconcileResult first = r.Reconcile({"a", "b", "a"});
  EXPECT_EQ(first.added.size(), 2u);
  EXPECT_TRUE(first.removed.empty());
  const WorkerRef b = *r.Find("b");

  ReconcileResult second = r.Reconcile({"b", "c"});
  ASSERT_EQ(second.added.size(), 1u);
  EXPECT_EQ(second.added[0].first, "c");
  ASSERT_EQ(second.removed.size(), 1u);
  EXPECT_EQ(second.removed[0].first, "a");
  EXPECT_EQ(*r.Find("b"), b);  // untouched
  EXPECT_FALSE(r.Find("a").has_value());
  EXPECT_EQ(r.size(), 2u);
}

TEST_F(RegistryTest, ReconcileReportsWhatDidNotFit) {
  RegistryOptions o = Options();
  o.max_workers = 2;
  WorkerRegistry r(o, 16, &clock_);
  ReconcileResult res = r.Reconcile({"a", "b", "c", ""});
  EXPECT_EQ(res.added.size(), 2u);
  ASSERT_EQ(res.rejected.size(), 2u);
  EXPECT_EQ(res.rejected[0].first, "c");
  EXPECT_EQ(res.rejected[0].second.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(res.rejected[1].first, "");
  EXPECT_EQ(res.rejected[1].second.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RegistryTest, RoutableNeedsServingHealthAndNoDrain) {
  WorkerRegistry r(Options(), 16, &clock_);
  ASSERT_TRUE(r.Add("a").ok());
  EXPECT_EQ(Why(r, "a"), Unroutable::kHealthUnknown);
  ASSERT_TRUE(r.SetHealth("a", HealthState::kNotServing).ok());
  EXPECT_EQ(Why(r, "a"), Unroutable::kNotServing);
  ASSERT_TRUE(r.SetHealth("a", HealthState::kServing).ok());
  EXPECT_EQ(Why(r, "a"), Unroutable::kNone);
  WorkerLoad draining;
  draining.draining = true;
  ASSERT_TRUE(r.ReportLoad("a", draining, 0, false).ok());
  EXPECT_EQ(Why(r, "a"), Unroutable::kDraining);
  EXPECT_EQ(r.SetHealth("zz", HealthState::kServing).code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, StalledWorkerBecomesUnroutableAfterTheStalenessBound) {
  WorkerRegistry r(Options(), 16, &clock_);
  AddServing(r, "a");
  clock_.Advance(absl::Milliseconds(1999));
  EXPECT_EQ(Why(r, "a"), Unroutable::kNone);
  clock_.Advance(absl::Milliseconds(2));
  EXPECT_EQ(Why(r, "a"), Unroutable::kStale);
  // Reports resume (SIGCONT): routable again at once.
  ASSERT_TRUE(r.ReportLoad("a", WorkerLoad{}, 0, false).ok());
  EXPECT_EQ(Why(r, "a"), Unroutable::kNone);
}

TEST_F(RegistryTest, StalenessCanBeTurnedOff) {
  RegistryOptions o = Options();
  o.load_staleness = absl::InfiniteDuration();
  WorkerRegistry r(o, 16, &clock_);
  AddServing(r, "a");
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(Why(r, "a"), Unroutable::kNone);
}

TEST_F(RegistryTest, ConsecutiveFailuresEjectAndSuccessResetsTheCount) {
  WorkerRegistry r(Options(), 16, &clock_);
  AddServing(r, "a");
  r.RecordFailure("a");
  r.RecordFailure("a");
  r.RecordSuccess("a");  // not consecutive any more
  r.RecordFailure("a");
  r.RecordFailure("a");
  EXPECT_EQ(Why(r, "a"), Unroutable::kNone);
  r.RecordFailure("a");
  EXPECT_EQ(Why(r, "a"), Unroutable::kEjected);
  EXPECT_EQ(r.StatusOf("a")->breaker, BreakerState::kOpen);
  EXPECT_EQ(r.StatusOf("a")->ejected_until, clock_.Now() + absl::Seconds(1));
}

TEST_F(RegistryTest, HalfOpenAllowsOneProbeAndSuccessCloses) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  for (int i = 0; i < 3; ++i) r.RecordFailure("a");
  EXPECT_FALSE(r.OnAssigned(a, 10, /*probe=*/false));  // ejected
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(r.ReportLoad("a", WorkerLoad{}, 0, false).ok());  // keep it fresh

  std::vector<WorkerView> views;
  r.Snapshot(&views);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_TRUE(views[0].half_open);
  EXPECT_EQ(views[0].unroutable, Unroutable::kNone);

  EXPECT_FALSE(r.OnAssigned(a, 10, /*probe=*/false));  // only a probe may go
  EXPECT_TRUE(r.OnAssigned(a, 10, /*probe=*/true));
  EXPECT_FALSE(r.OnAssigned(a, 10, /*probe=*/true));  // one at a time
  EXPECT_EQ(Why(r, "a"), Unroutable::kProbeInFlight);

  r.RecordSuccess("a");
  r.OnFinished(a, /*probe=*/true);
  EXPECT_EQ(r.StatusOf("a")->breaker, BreakerState::kClosed);
  EXPECT_TRUE(r.OnAssigned(a, 10, false));
  EXPECT_TRUE(r.OnAssigned(a, 10, false));
}

TEST_F(RegistryTest, FailedProbesBackOffExponentiallyUpToTheCap) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  for (int i = 0; i < 3; ++i) r.RecordFailure("a");
  std::vector<absl::Duration> backoffs;
  for (int round = 0; round < 5; ++round) {
    const absl::Duration d = r.StatusOf("a")->ejected_until - clock_.Now();
    backoffs.push_back(d);
    clock_.Advance(d);
    ASSERT_TRUE(r.OnAssigned(a, 1, /*probe=*/true));
    r.RecordFailure("a");  // the probe fails
    r.OnFinished(a, true);
  }
  EXPECT_THAT(backoffs, ElementsAre(absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                                    absl::Seconds(5), absl::Seconds(5)));
  EXPECT_EQ(r.StatusOf("a")->ejections_total, 6u);
}

TEST_F(RegistryTest, ProbeEndingWithoutVerdictFreesTheProbe) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  for (int i = 0; i < 3; ++i) r.RecordFailure("a");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(r.OnAssigned(a, 1, true));
  r.OnFinished(a, true);  // e.g. the client cancelled before the first token
  EXPECT_EQ(r.StatusOf("a")->breaker, BreakerState::kHalfOpen);
  EXPECT_TRUE(r.OnAssigned(a, 1, true));
}

TEST_F(RegistryTest, EjectionPercentLimitKeepsSomeWorkersRoutable) {
  RegistryOptions o = Options();
  o.max_ejected_percent = 50;
  WorkerRegistry r(o, 16, &clock_);
  for (const char* id : {"a", "b", "c", "d"}) AddServing(r, id);
  for (const char* id : {"a", "b", "c", "d"}) {
    for (int i = 0; i < 3; ++i) r.RecordFailure(id);
  }
  int ejected = 0;
  for (const WorkerStatus& s : r.Status()) ejected += s.breaker == BreakerState::kOpen;
  EXPECT_EQ(ejected, 2);
  // A single worker may always be ejected.
  WorkerRegistry single(o, 16, &clock_);
  AddServing(single, "x");
  for (int i = 0; i < 3; ++i) single.RecordFailure("x");
  EXPECT_EQ(single.StatusOf("x")->breaker, BreakerState::kOpen);
}

TEST_F(RegistryTest, AssignmentsArePendingUntilTheNextLoadReport) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  ASSERT_TRUE(r.OnAssigned(a, 100, false));
  ASSERT_TRUE(r.OnAssigned(a, 50, false));
  std::vector<WorkerView> v;
  r.Snapshot(&v);
  EXPECT_EQ(v[0].in_flight, 2);
  EXPECT_EQ(v[0].pending_requests, 2);
  EXPECT_EQ(v[0].pending_prefill_tokens, 150);

  WorkerLoad load;
  load.running_requests = 2;
  ASSERT_TRUE(r.ReportLoad("a", load, 0, false).ok());
  r.Snapshot(&v);
  EXPECT_EQ(v[0].pending_requests, 0);
  EXPECT_EQ(v[0].pending_prefill_tokens, 0);
  EXPECT_EQ(v[0].in_flight, 2);
  EXPECT_EQ(v[0].load.running_requests, 2);
  r.OnFinished(a, false);
  r.OnFinished(a, false);
  r.OnFinished(a, false);  // an extra call never goes negative
  r.Snapshot(&v);
  EXPECT_EQ(v[0].in_flight, 0);
}

TEST_F(RegistryTest, RequestFinishingBeforeTheNextReportLeavesThePendingLoad) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  uint64_t e1 = 0, e2 = 0;
  ASSERT_TRUE(r.OnAssigned(a, 100, false, &e1));
  ASSERT_TRUE(r.OnAssigned(a, 30, false, &e2));
  r.OnFinished(a, false, e1, 100);  // ended before any report saw it
  std::vector<WorkerView> v;
  r.Snapshot(&v);
  EXPECT_EQ(v[0].pending_requests, 1);
  EXPECT_EQ(v[0].pending_prefill_tokens, 30);
  ASSERT_TRUE(r.ReportLoad("a", WorkerLoad{}, 0, false).ok());
  uint64_t e3 = 0;
  ASSERT_TRUE(r.OnAssigned(a, 50, false, &e3));
  r.OnFinished(a, false, e2, 30);  // from before the report: only in-flight changes
  r.Snapshot(&v);
  EXPECT_EQ(v[0].pending_requests, 1);
  EXPECT_EQ(v[0].pending_prefill_tokens, 50);
  EXPECT_EQ(v[0].in_flight, 1);
}

TEST_F(RegistryTest, RemovedWorkersOldRequestsDoNotTouchItsSuccessor) {
  WorkerRegistry r(Options(), 16, &clock_);
  const WorkerRef a = AddServing(r, "a");
  ASSERT_TRUE(r.OnAssigned(a, 10, false));
  ASSERT_TRUE(r.Remove("a").has_value());
  const WorkerRef b = AddServing(r, "b");
  ASSERT_EQ(b.slot, a.slot);
  ASSERT_TRUE(r.OnAssigned(b, 10, false));
  r.OnFinished(a, false);  // the removed worker's request ends
  EXPECT_FALSE(r.OnAssigned(a, 10, false));
  EXPECT_EQ(r.StatusOf("b")->in_flight, 1);
}

TEST_F(RegistryTest, DetectsSequenceGaps) {
  WorkerRegistry r(Options(), 16, &clock_);
  ASSERT_TRUE(r.Add("a").ok());
  EXPECT_FALSE(r.ReportLoad("a", {}, 1, true)->sequence_gap);
  EXPECT_FALSE(r.ReportLoad("a", {}, 2, false)->sequence_gap);
  EXPECT_TRUE(r.ReportLoad("a", {}, 4, false)->sequence_gap);
  EXPECT_FALSE(r.ReportLoad("a", {}, 5, false)->sequence_gap);
  // A new subscription that starts with a snapshot is no gap.
  EXPECT_FALSE(r.ReportLoad("a", {}, 1, true)->sequence_gap);
  // Unnumbered reports are not checked.
  EXPECT_FALSE(r.ReportLoad("a", {}, 0, false)->sequence_gap);
}

TEST_F(RegistryTest, ReportLoadGivesTheWorkersHashScheme) {
  WorkerRegistry r(Options(), 16, &clock_);
  ASSERT_TRUE(r.Add("a").ok());
  EXPECT_EQ(r.ReportLoad("a", {}, 0, false)->scheme, (HashScheme{16, 0}));
  WorkerStaticInfo info;
  info.kv_block_size = 32;
  info.prefix_hash_seed = 9;
  ASSERT_TRUE(r.SetInfo("a", info).ok());
  EXPECT_EQ(r.ReportLoad("a", {}, 0, false)->scheme, (HashScheme{32, 9}));
}

// Many threads assign, finish, fail, report and reconcile at once; the
// bookkeeping must balance and never crash.
TEST_F(RegistryTest, ConcurrentUseKeepsCountsConsistent) {
  RegistryOptions o = Options();
  o.max_workers = 16;
  o.load_staleness = absl::InfiniteDuration();
  WorkerRegistry r(o, 16, SystemClock::Get());
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) ids.push_back("w" + std::to_string(i));
  r.Reconcile(ids);
  for (const auto& id : ids) ASSERT_TRUE(r.SetHealth(id, HealthState::kServing).ok());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> assigned{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<WorkerView> views;
      for (int i = 0; i < 4000; ++i) {
        r.Snapshot(&views);
        if (views.empty()) continue;
        const WorkerView& v = views[(i + t) % views.size()];
        if (r.OnAssigned(v.ref, 16, v.half_open)) {
          assigned.fetch_add(1);
          const std::string id = r.IdOf(v.ref).value_or("");
          if (i % 7 == 0) r.RecordFailure(id);
          if (i % 3 == 0) r.RecordSuccess(id);
          r.OnFinished(v.ref, v.half_open);
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; !stop.load(); ++i) {
      for (const auto& id : ids) r.ReportLoad(id, WorkerLoad{}, 0, false).IgnoreError();
      // Membership churn: drop and re-add one worker.
      r.Reconcile(std::vector<std::string>(ids.begin() + (i % 2), ids.end()));
      r.Reconcile(ids);
      for (const auto& id : ids) r.SetHealth(id, HealthState::kServing).IgnoreError();
    }
  });
  for (int t = 0; t < 4; ++t) threads[t].join();
  stop.store(true);
  threads.back().join();

  EXPECT_GT(assigned.load(), 0);
  for (const WorkerStatus& s : r.Status()) EXPECT_EQ(s.in_flight, 0) << s.id;
  EXPECT_EQ(r.size(), ids.size());
}

}  // namespace
}  // namespace tessera::router
