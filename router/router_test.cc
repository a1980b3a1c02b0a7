#include "router/router.h"

#include <atomic>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

using ::testing::HasSubstr;

std::vector<TokenId> Tokens(int n, TokenId first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The stored event a worker with `scheme` sends after caching the full
// blocks of `tokens`.
struct StoredEvent {
  std::vector<uint64_t> hashes;
  std::vector<TokenId> tokens;
  BlockEvent View() const {
    BlockEvent e;
    e.kind = BlockEvent::Kind::kStored;
    e.block_hashes = hashes;
    e.token_ids = tokens;
    return e;
  }
};

StoredEvent CacheOf(const std::vector<TokenId>& tokens, const HashScheme& scheme) {
  StoredEvent e;
  ComputeBlockHashes(tokens, scheme, &e.hashes);
  e.tokens.assign(tokens.begin(), tokens.begin() + e.hashes.size() * scheme.block_size);
  return e;
}

class RouterTest : public ::testing::Test {
 protected:
  RouterOptions Options() {
    RouterOptions o;
    o.registry.max_workers = 16;
    o.registry.load_staleness = absl::Seconds(5);
    o.registry.max_ejected_percent = 100;
    o.rng_seed = 1234;
    return o;
  }

  // A serving worker with an empty, exact prefix cache (snapshot received).
  void AddWorker(Router& r, const std::string& id, int block_size = 16) {
    ASSERT_TRUE(r.AddWorker(id).ok());
    WorkerStaticInfo info;
    info.kv_block_size = block_size;
    info.kv_blocks_total = 1000;
    ASSERT_TRUE(r.SetWorkerInfo(id, info).ok());
    ASSERT_TRUE(r.SetHealth(id, HealthState::kServing).ok());
    LoadReportView snapshot;
    snapshot.sequence = 1;
    snapshot.events_reset = true;
    ASSERT_TRUE(r.ApplyLoadReport(id, snapshot).ok());
    sequence_[id] = 1;
  }

  absl::Status Report(Router& r, const std::string& id, const WorkerLoad& load,
                      const std::vector<BlockEvent>& events = {}) {
    LoadReportView v;
    v.sequence = ++sequence_[id];
    v.load = load;
    v.events = events;
    return r.ApplyLoadReport(id, v);
  }

  absl::Status Cache(Router& r, const std::string& id, const std::vector<TokenId>& tokens,
                     int block_size = 16) {
    StoredEvent e = CacheOf(tokens, HashScheme{block_size, 0});
    return Report(r, id, WorkerLoad{}, {e.View()});
  }

  RouteRequest Request(const std::vector<TokenId>& tokens) {
    RouteRequest req;
    req.token_ids = tokens;
    return req;
  }

  FakeClock clock_;
  std::map<std::string, uint64_t> sequence_;
};

TEST_F(RouterTest, PrefersTheWorkerThatHasThePrefixCached) {
  Router r(Options(), &clock_);
  for (const char* id : {"a", "b", "c"}) AddWorker(r, id);
  const std::vector<TokenId> system = Tokens(512, 100);
  ASSERT_TRUE(Cache(r, "b", system).ok());
  const std::vector<TokenId> prompt = Concat(system, Tokens(100, 9000));
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<RouteDecision> d = r.Route(Request(prompt));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->worker_id, "b");
    EXPECT_EQ(d->cached_tokens, 512);
    EXPECT_EQ(d->prompt_tokens, 612);
    EXPECT_EQ(d->reason, RouteReason::kCost);
    EXPECT_EQ(d->candidates, 3);
  }
}

TEST_F(RouterTest, FullyCachedPromptStillPrefillsItsLastBlock) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  const std::vector<TokenId> prompt = Tokens(64, 1);  // exactly 4 blocks
  ASSERT_TRUE(Cache(r, "a", prompt).ok());
  absl::StatusOr<RouteDecision> d = r.Route(Request(prompt));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->cached_tokens, 48);
}

TEST_F(RouterTest, LoadOutweighsTheCacheWhenTheQueueIsLonger) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  AddWorker(r, "b");
  const std::vector<TokenId> prompt = Tokens(1024, 1);
  ASSERT_TRUE(Cache(r, "a", prompt).ok());
  // "a" saves 1008 tokens of prefill; a queue worth more than that on "a"
  // sends the request to "b".
  WorkerLoad busy;
  busy.waiting_prefill_tokens = 4000;
  busy.waiting_requests = 4;
  ASSERT_TRUE(Report(r, "a", busy).ok());
  absl::StatusOr<RouteDecision> d = r.Route(Request(prompt));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker_id, "b");
  EXPECT_EQ(d->cached_tokens, 0);
  // A small queue does not.
  WorkerLoad light;
  light.waiting_prefill_tokens = 200;
  light.waiting_requests = 1;
  ASSERT_TRUE(Report(r, "a", light).ok());
  d = r.Route(Request(prompt));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker_id, "a");
}

TEST_F(RouterTest, NoCandidateGivesUnavailableWithReasons) {
  Router r(Options(), &clock_);
  EXPECT_EQ(r.Route(Request(Tokens(10, 1))).status().code(), absl::StatusCode::kUnavailable);
  AddWorker(r, "a");
  AddWorker(r, "b");
  ASSERT_TRUE(r.AddWorker("c").ok());  // health unknown
  ASSERT_TRUE(r.SetHealth("b", HealthState::kNotServing).ok());
  const std::vector<std::string> tried = {"a"};
  RouteRequest req = Request(Tokens(10, 1));
  req.exclude = tried;
  absl::StatusOr<RouteDecision> d = r.Route(req);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("3 registered"));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("1 not_serving"));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("1 health_unknown"));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("1 already tried"));
}

TEST_F(RouterTest, ExcludedWorkersAreSkipped) {
  Router r(Options(), &clock_);
  for (const char* id : {"a", "b", "c"}) AddWorker(r, id);
  const std::vector<TokenId> prompt = Tokens(256, 1);
  ASSERT_TRUE(Cache(r, "a", prompt).ok());
  const std::vector<std::string> tried = {"a"};
  RouteRequest req = Request(prompt);
  req.exclude = tried;
  for (int i = 0; i < 20; ++i) EXPECT_NE(r.Route(req)->worker_id, "a");
}

TEST_F(RouterTest, EjectedWorkerGetsOneProbeAfterItsBackoff) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  AddWorker(r, "b");
  for (int i = 0; i < 3; ++i) r.RecordFailure("a");
  for (int i = 0; i < 20; ++i) EXPECT_EQ(r.Route(Request(Tokens(32, 1)))->worker_id, "b");

  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Report(r, "a", {}).ok());
  ASSERT_TRUE(Report(r, "b", {}).ok());
  // Make "a" the better choice, so that the probe goes there.
  const std::vector<TokenId> prompt = Tokens(512, 1);
  ASSERT_TRUE(Cache(r, "a", prompt).ok());
  absl::StatusOr<RouteDecision> probe = r.RouteAndAssign(Request(prompt));
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->worker_id, "a");
  EXPECT_TRUE(probe->probe);
  // While the probe is out, nothing else goes to "a".
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r.Route(Request(prompt))->worker_id, "b");
  r.RecordSuccess("a");
  r.OnFinished(*probe);
  absl::StatusOr<RouteDecision> after = r.Route(Request(prompt));
  EXPECT_EQ(after->worker_id, "a");
  EXPECT_FALSE(after->probe);
}

TEST_F(RouterTest, SessionAffinityHoldsUntilTheWorkerIsOverloadedOrGone) {
  Router r(Options(), &clock_);
  for (const char* id : {"a", "b", "c"}) AddWorker(r, id);
  const std::vector<TokenId> prompt = Tokens(40, 1);
  RouteRequest req = Request(prompt);
  req.routing_key = "session-1";
  absl::StatusOr<RouteDecision> first = r.RouteAndAssign(req);
  ASSERT_TRUE(first.ok());
  r.OnFinished(*first);
  const std::string sticky = first->worker_id;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<RouteDecision> d = r.RouteAndAssign(req);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->worker_id, sticky);
    r.OnFinished(*d);
  }
  // Overloaded beyond overload_factor * best + slack: the key moves.
  WorkerLoad heavy;
  heavy.waiting_prefill_tokens = 50000;
  ASSERT_TRUE(Report(r, sticky, heavy).ok());
  absl::StatusOr<RouteDecision> moved = r.RouteAndAssign(req);
  ASSERT_TRUE(moved.ok());
  EXPECT_NE(moved->worker_id, sticky);
  EXPECT_EQ(moved->reason, RouteReason::kCost);
  r.OnFinished(*moved);
  // ...and sticks to its new worker, which then goes away.
  absl::StatusOr<RouteDecision> again = r.RouteAndAssign(req);
  EXPECT_EQ(again->worker_id, moved->worker_id);
  EXPECT_EQ(again->reason, RouteReason::kAffinity);
  r.OnFinished(*again);
  ASSERT_TRUE(r.SetHealth(moved->worker_id, HealthState::kNotServing).ok());
  absl::StatusOr<RouteDecision> last = r.Route(req);
  ASSERT_TRUE(last.ok());
  EXPECT_NE(last->worker_id, moved->worker_id);
}

TEST_F(RouterTest, PredictionsKeepABurstOfOnePrefixTogether) {
  RouterOptions o = Options();
  Router r(o, &clock_);
  for (const char* id : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(r.AddWorker(id).ok());  // no snapshot: approximate mode
    ASSERT_TRUE(r.SetHealth(id, HealthState::kServing).ok());
  }
  const std::vector<TokenId> shared = Tokens(1024, 1);
  std::vector<RouteDecision> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<RouteDecision> d =
        r.RouteAndAssign(Request(Concat(shared, Tokens(8, 5000 + i * 8))));
    ASSERT_TRUE(d.ok());
    held.push_back(*d);
  }
  EXPECT_EQ(held[1].worker_id, held[0].worker_id);
  EXPECT_EQ(held[2].worker_id, held[0].worker_id);
  EXPECT_EQ(held[0].cached_tokens, 0);
  EXPECT_EQ(held[1].cached_tokens, 1024);
  for (const RouteDecision& d : held) r.OnFinished(d);
}

TEST_F(RouterTest, OptimisticLoadSpreadsABurstWithoutCacheBenefit) {
  Router r(Options(), &clock_);
  for (const char* id : {"a", "b", "c", "d"}) AddWorker(r, id);
  std::map<std::string, int> per_worker;
  std::vector<RouteDecision> held;
  for (int i = 0; i < 40; ++i) {
    // Distinct prompts: no prefix to share.
    absl::StatusOr<RouteDecision> d = r.RouteAndAssign(Request(Tokens(512, 100000 + i * 1000)));
    ASSERT_TRUE(d.ok());
    ++per_worker[d->worker_id];
    held.push_back(*d);
  }
  ASSERT_EQ(per_worker.size(), 4u);
  for (const auto& [id, n] : per_worker) {
    EXPECT_GE(n, 8) << id;
    EXPECT_LE(n, 12) << id;
  }
  for (const RouteDecision& d : held) r.OnFinished(d);
  for (const WorkerReport& w : r.Report()) EXPECT_EQ(w.status.in_flight, 0);
}

TEST_F(RouterTest, WorkersWithDifferentBlockSizesAreMatchedInTheirOwnScheme) {
  Router r(Options(), &clock_);
  AddWorker(r, "small", 16);
  AddWorker(r, "large", 64);
  const std::vector<TokenId> prompt = Tokens(300, 7);
  // "small" holds 10 blocks of 16 = 160 tokens; "large" 4 blocks of 64 = 256.
  ASSERT_TRUE(
      Cache(r, "small", std::vector<TokenId>(prompt.begin(), prompt.begin() + 160), 16).ok());
  ASSERT_TRUE(
      Cache(r, "large", std::vector<TokenId>(prompt.begin(), prompt.begin() + 256), 64).ok());
  absl::StatusOr<RouteDecision> d = r.Route(Request(prompt));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker_id, "large");
  EXPECT_EQ(d->cached_tokens, 256);
  EXPECT_EQ(d->scheme.block_size, 64);
  EXPECT_EQ(d->block_hashes.size(), 4u);
  const std::vector<std::string> tried = {"large"};
  RouteRequest req = Request(prompt);
  req.exclude = tried;
  d = r.Route(req);
  EXPECT_EQ(d->worker_id, "small");
  EXPECT_EQ(d->cached_tokens, 160);
}

TEST_F(RouterTest, PrecomputedHashesStandInForTokens) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  AddWorker(r, "b");
  const std::vector<TokenId> prompt = Tokens(200, 3);
  ASSERT_TRUE(Cache(r, "b", prompt).ok());
  std::vector<uint64_t> hashes;
  ComputeBlockHashes(prompt, HashScheme{16, 0}, &hashes);
  RouteRequest req;
  req.block_hashes = hashes;
  req.hashes_scheme = HashScheme{16, 0};
  req.prompt_tokens = 200;
  absl::StatusOr<RouteDecision> d = r.Route(req);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker_id, "b");
  EXPECT_EQ(d->cached_tokens, 192);
}

TEST_F(RouterTest, HashMismatchFallsBackToPredictionsUntilAGoodSnapshot) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  // The worker hashes with seed 7, the router believes 0.
  StoredEvent wrong = CacheOf(Tokens(64, 1), HashScheme{16, 7});
  absl::Status s = Report(r, "a", {}, {wrong.View()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("seed"));
  EXPECT_EQ(r.Report()[0].index.mode, IndexMode::kApproximate);
  // Further events are ignored quietly until a snapshot verifies.
  EXPECT_TRUE(Report(r, "a", {}, {wrong.View()}).ok());
  EXPECT_EQ(r.Report()[0].index.exact_blocks, 0);
  StoredEvent right = CacheOf(Tokens(64, 1), HashScheme{16, 0});
  LoadReportView snap;
  snap.sequence = ++sequence_["a"];
  snap.events_reset = true;
  std::vector<BlockEvent> events = {right.View()};
  snap.events = events;
  EXPECT_TRUE(r.ApplyLoadReport("a", snap).ok());
  EXPECT_EQ(r.Report()[0].index.mode, IndexMode::kExact);
  EXPECT_EQ(r.Report()[0].index.exact_blocks, 4);
}

TEST_F(RouterTest, LoadReportProblemsAreNamed) {
  Router r(Options(), &clock_);
  EXPECT_EQ(r.ApplyLoadReport("nobody", LoadReportView{}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(r.AddWorker("a").ok());
  ASSERT_TRUE(r.SetHealth("a", HealthState::kServing).ok());
  StoredEvent e = CacheOf(Tokens(32, 1), HashScheme{16, 0});
  LoadReportView v;
  v.sequence = 1;
  std::vector<BlockEvent> events = {e.View()};
  v.events = events;
  absl::Status s = r.ApplyLoadReport("a", v);  // events without a snapshot
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("include_snapshot"));

  v.sequence = 2;
  v.events_reset = true;
  ASSERT_TRUE(r.ApplyLoadReport("a", v).ok());
  LoadReportView gap;
  gap.sequence = 5;
  s = r.ApplyLoadReport("a", gap);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("resubscribe"));
}

TEST_F(RouterTest, RoundRobinAndLeastLoadedPolicies) {
  RouterOptions o = Options();
  o.policy.kind = PolicyKind::kRoundRobin;
  Router rr(o, &clock_);
  for (const char* id : {"a", "b", "c"}) AddWorker(rr, id);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) order.push_back(rr.Route(Request(Tokens(20, 1)))->worker_id);
  EXPECT_THAT(order, ::testing::ElementsAre("a", "b", "c", "a", "b", "c"));

  o.policy.kind = PolicyKind::kLeastLoaded;
  Router ll(o, &clock_);
  for (const char* id : {"a", "b", "c"}) AddWorker(ll, id);
  WorkerLoad two, one;
  two.running_requests = 2;
  one.running_requests = 1;
  ASSERT_TRUE(Report(ll, "a", two).ok());
  ASSERT_TRUE(Report(ll, "b", one).ok());
  ASSERT_TRUE(Report(ll, "c", two).ok());
  absl::StatusOr<RouteDecision> d = ll.RouteAndAssign(Request(Tokens(20, 1)));
  EXPECT_EQ(d->worker_id, "b");
  EXPECT_EQ(d->reason, RouteReason::kLeastLoaded);
  // The assignment counts until the next report: b is now tied with a and c.
  std::map<std::string, int> n;
  for (int i = 0; i < 300; ++i) ++n[ll.Route(Request(Tokens(20, 1)))->worker_id];
  EXPECT_EQ(n.size(), 3u);
  ll.OnFinished(*d);
}

TEST_F(RouterTest, RemovedWorkerWithRequestsInFlightAndSlotReuse) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  const std::vector<TokenId> prompt = Tokens(256, 1);
  ASSERT_TRUE(Cache(r, "a", prompt).ok());
  absl::StatusOr<RouteDecision> d = r.RouteAndAssign(Request(prompt));
  ASSERT_TRUE(d.ok());
  ReconcileResult res = r.Reconcile({"z"});  // "a" goes, "z" takes its slot
  ASSERT_EQ(res.removed.size(), 1u);
  ASSERT_EQ(res.added.size(), 1u);
  EXPECT_EQ(res.added[0].second.slot, d->worker.slot);
  r.OnFinished(*d);  // no effect, no crash
  EXPECT_FALSE(r.OnAssigned(&*d));
  ASSERT_TRUE(r.SetHealth("z", HealthState::kServing).ok());
  absl::StatusOr<RouteDecision> z = r.Route(Request(prompt));
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->worker_id, "z");
  EXPECT_EQ(z->cached_tokens, 0);  // the old worker's cache is not inherited
  EXPECT_EQ(r.Report()[0].status.in_flight, 0);
}

TEST_F(RouterTest, StalledWorkerStopsGettingRequests) {
  Router r(Options(), &clock_);
  AddWorker(r, "a");
  AddWorker(r, "b");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(Report(r, "b", {}).ok());
  clock_.Advance(absl::Seconds(2));  // "a": 6 s without a report (> 5 s)
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r.Route(Request(Tokens(32, 1)))->worker_id, "b");
}

// Routing threads, a feeder thread per worker and a membership thread at
// once: no crash, decisions name registered workers, and the in-flight
// bookkeeping balances.
TEST_F(RouterTest, ConcurrentRoutingFeedingAndReconciling) {
  RouterOptions o = Options();
  o.registry.load_staleness = absl::InfiniteDuration();
  Router r(o, SystemClock::Get());
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) ids.push_back("w" + std::to_string(i));
  r.Reconcile(ids);
  for (const auto& id : ids) ASSERT_TRUE(r.SetHealth(id, HealthState::kServing).ok());
  const std::vector<TokenId> shared = Tokens(256, 1);

  std::atomic<bool> stop{false};
  std::atomic<int> routed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1500; ++i) {
        std::vector<TokenId> prompt = Concat(shared, Tokens(64, 10000 * (t + 1) + i));
        RouteRequest req;
        req.token_ids = prompt;
        const std::string key = "k" + std::to_string(i % 17);
        req.routing_key = key;
        absl::StatusOr<RouteDecision> d = r.RouteAndAssign(req);
        if (!d.ok()) continue;
        routed.fetch_add(1);
        if (i % 11 == 0) r.RecordFailure(d->worker_id);
        if (i % 5 == 0) r.RecordSuccess(d->worker_id);
        r.OnFinished(*d);
      }
    });
  }
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      const std::string id = ids[w];
      uint64_t seq = 0;
      StoredEvent e = CacheOf(shared, HashScheme{16, 0});
      std::vector<BlockEvent> stored = {e.View()};
      BlockEvent rm_event = e.View();
      rm_event.kind = BlockEvent::Kind::kRemoved;
      std::vector<BlockEvent> removed = {rm_event};
      for (int i = 0; !stop.load(); ++i) {
        LoadReportView v;
        v.sequence = ++seq;
        v.events_reset = i % 50 == 0;
        v.events = i % 2 == 0 ? absl::MakeConstSpan(stored) : absl::MakeConstSpan(removed);
        v.load.running_requests = i % 4;
        r.ApplyLoadReport(id, v).IgnoreError();  // NOT_FOUND while removed
        if (v.events_reset) r.SetHealth(id, HealthState::kServing).IgnoreError();
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; !stop.load(); ++i) {
      r.Reconcile(std::vector<std::string>(ids.begin() + 1 + i % 3, ids.end()));
      r.Reconcile(ids);
      for (const auto& id : ids) r.SetHealth(id, HealthState::kServing).IgnoreError();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (int t = 0; t < 3; ++t) threads[t].join();
  stop.store(true);
  for (size_t t = 3; t < threads.size(); ++t) threads[t].join();
  EXPECT_GT(routed.load(), 1000);
  for (const WorkerReport& w : r.Report()) EXPECT_EQ(w.status.in_flight, 0) << w.status.id;
}

// Feeders storing and removing blocks while requests are routed to the same
// workers (whose predictions change the same index tables): once the feeders
// stop on a known state, the index holds exactly that state.
TEST_F(RouterTest, IndexEndsInTheFeedersStateAfterConcurrentChurn) {
  RouterOptions o = Options();
  o.registry.load_staleness = absl::InfiniteDuration();
  o.index.apply_chunk = 3;  // many lock holds per report
  Router r(o, SystemClock::Get());
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back("w" + std::to_string(i));
    AddWorker(r, ids.back());
  }
  const std::vector<TokenId> shared = Tokens(256, 1);
  std::atomic<int> routed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        std::vector<TokenId> prompt = Concat(shared, Tokens(48, 100000 * (t + 1) + 64 * i));
        RouteRequest req;
        req.token_ids = prompt;
        absl::StatusOr<RouteDecision> d = r.RouteAndAssign(req);
        if (!d.ok()) continue;
        routed.fetch_add(1);
        r.OnFinished(*d);
      }
    });
  }
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      const std::string id = ids[w];
      uint64_t seq = 1;
      StoredEvent e = CacheOf(shared, HashScheme{16, 0});
      std::vector<BlockEvent> stored = {e.View()};
      BlockEvent rm_event = e.View();
      rm_event.kind = BlockEvent::Kind::kRemoved;
      std::vector<BlockEvent> removed = {rm_event};
      // Store, remove, ..., store: every worker ends holding the prefix once.
      for (int i = 0; i <= 600; ++i) {
        LoadReportView v;
        v.sequence = ++seq;
        v.events = i % 2 == 0 ? absl::MakeConstSpan(stored) : absl::MakeConstSpan(removed);
        ASSERT_TRUE(r.ApplyLoadReport(id, v).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(routed.load(), 2000);
  for (const WorkerReport& w : r.Report()) {
    EXPECT_EQ(w.status.in_flight, 0) << w.status.id;
    EXPECT_EQ(w.index.mode, IndexMode::kExact) << w.status.id;
    EXPECT_EQ(w.index.exact_blocks, 16) << w.status.id;
  }
  // Every worker matches the whole prefix (up to its last block, which the
  // worker recomputes) and nothing beyond it.
  absl::StatusOr<RouteDecision> d = r.Route(Request(shared));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->cached_tokens, 240);
  for (const std::string& id : ids) {
    const std::vector<std::string> others = [&] {
      std::vector<std::string> v;
      for (const std::string& x : ids) {
        if (x != id) v.push_back(x);
      }
      return v;
    }();
    RouteRequest req = Request(shared);
    req.exclude = others;
    absl::StatusOr<RouteDecision> one = r.Route(req);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->worker_id, id);
    EXPECT_EQ(one->cached_tokens, 240) << id;
  }
}

}  // namespace
}  // namespace tessera::router
