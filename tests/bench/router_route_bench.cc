// Route-decision latency of the routing core, per decision, at steady state:
// 16 workers with exact prefix indexes (32 shared 1,536-token system prompts
// cached on two workers each, plus 16,384 other cached blocks per worker),
// 1,000 requests in flight (each new request is routed and assigned, and the
// oldest one finishes), 2,048-token prompts (a shared prefix plus 512 unique
// tokens), a session key on every request (1,024 sessions).
//
// Each benchmark times every decision on its own and reports the
// distribution as counters (microseconds): p50, p90, p99, p999, max, and
// slowest_at, the index of the slowest decision. Variants:
//   route            Route() only (hashing + index lookup + policy)
//   route_and_assign RouteAndAssign() (what the adapter calls per attempt)
//   .../feeder       with a thread feeding every worker a load report with
//                    prefix-cache events at 10 Hz, as the WatchLoad streams do
//   .../concurrent   two routing threads on one router (500 in flight each),
//                    plus the feeder: lock contention included
//   policy           the three policies, Route() only
//   hash_prompt      hashing one 2,048-token prompt (part of every decision)
//
// Run (from the repository root):
//   build/tests/bench/router_route_bench
//       --benchmark_out=tests/bench/results/router_route_decision.json
//       --benchmark_out_format=json
// (one command line). The checked-in results come from the 16-core host of the
// GPU machine (router/README.md, "Latency").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmark/benchmark.h"
#include "router/router.h"

namespace tessera::router {
namespace {

constexpr int kWorkers = 16;
constexpr int kInFlight = 1000;
constexpr int kBlockSize = 16;
constexpr int kPrefixes = 32;
constexpr int kPrefixTokens = 1536;
constexpr int kUniqueTokens = 512;
constexpr int kBackgroundChains = 256;  // per worker
constexpr int kChainBlocks = 64;
constexpr int kSessions = 1024;

std::string WorkerId(int w) { return absl::StrCat("10.0.0.", w + 1, ":50051"); }

std::vector<TokenId> RandomTokens(std::mt19937& rng, int n) {
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng() % 151000);
  return t;
}

struct Workload {
  std::vector<std::vector<TokenId>> prefixes;
  std::vector<std::string> keys;  // session i uses prefix i % kPrefixes
};

// A stored event for the full blocks of `tokens`.
struct Chain {
  std::vector<uint64_t> hashes;
  std::vector<TokenId> tokens;
};

Chain MakeChain(const std::vector<TokenId>& tokens) {
  Chain c;
  ComputeBlockHashes(tokens, HashScheme{kBlockSize, 0}, &c.hashes);
  c.tokens.assign(tokens.begin(), tokens.begin() + c.hashes.size() * kBlockSize);
  return c;
}

BlockEvent StoredView(const Chain& c) {
  BlockEvent e;
  e.kind = BlockEvent::Kind::kStored;
  e.block_hashes = c.hashes;
  e.token_ids = c.tokens;
  return e;
}

WorkerLoad RandomLoad(std::mt19937& rng) {
  WorkerLoad l;
  l.running_requests = 8 + rng() % 32;
  l.waiting_requests = rng() % 8;
  l.waiting_prefill_tokens = rng() % 8000;
  l.kv_blocks_total = 50000;
  l.kv_blocks_used = 20000 + rng() % 28000;
  return l;
}

// Registers the workers, gives each a snapshot of its cache, and builds the
// prompts.
Workload Setup(Router& router, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> ids;
  for (int w = 0; w < kWorkers; ++w) ids.push_back(WorkerId(w));
  router.Reconcile(ids);
  std::vector<std::vector<TokenId>> prefixes;
  for (int p = 0; p < kPrefixes; ++p) prefixes.push_back(RandomTokens(rng, kPrefixTokens));
  for (int w = 0; w < kWorkers; ++w) {
    WorkerStaticInfo info;
    info.kv_block_size = kBlockSize;
    info.kv_blocks_total = 50000;
    router.SetWorkerInfo(ids[w], info).IgnoreError();
    router.SetHealth(ids[w], HealthState::kServing).IgnoreError();
    std::vector<Chain> chains;
    for (int p = 0; p < kPrefixes; ++p) {
      if (p % kWorkers == w || (p + 5) % kWorkers == w) chains.push_back(MakeChain(prefixes[p]));
    }
    for (int c = 0; c < kBackgroundChains; ++c) {
      chains.push_back(MakeChain(RandomTokens(rng, kChainBlocks * kBlockSize)));
    }
    std::vector<BlockEvent> events;
    for (const Chain& c : chains) events.push_back(StoredView(c));
    LoadReportView snapshot;
    snapshot.sequence = 1;
    snapshot.events_reset = true;
    snapshot.load = RandomLoad(rng);
    snapshot.events = events;
    absl::Status s = router.ApplyLoadReport(ids[w], snapshot);
    if (!s.ok()) std::abort();
  }
  Workload wl;
  wl.prefixes = std::move(prefixes);
  for (int i = 0; i < kSessions; ++i) wl.keys.push_back(absl::StrCat("session-", i));
  return wl;
}

// Sends every worker a load report with a few stored and removed blocks, 10
// times a second per worker, until stopped.
class Feeder {
 public:
  explicit Feeder(Router* router) : router_(router), thread_([this] { Run(); }) {}
  ~Feeder() {
    stop_.store(true);
    thread_.join();
  }
  uint64_t reports() const { return reports_.load(); }

 private:
  void Run() {
    std::mt19937 rng(99);
    std::vector<uint64_t> sequence(kWorkers, 1);
    std::vector<std::deque<Chain>> recent(kWorkers);
    while (!stop_.load()) {
      for (int w = 0; w < kWorkers && !stop_.load(); ++w) {
        std::vector<BlockEvent> events;
        recent[w].push_back(MakeChain(RandomTokens(rng, 8 * kBlockSize)));
        events.push_back(StoredView(recent[w].back()));
        Chain evicted;
        if (recent[w].size() > 4) {
          evicted = std::move(recent[w].front());
          recent[w].pop_front();
          BlockEvent rm;
          rm.kind = BlockEvent::Kind::kRemoved;
          rm.block_hashes = evicted.hashes;
          events.push_back(rm);
        }
        LoadReportView v;
        v.sequence = ++sequence[w];
        v.load = RandomLoad(rng);
        v.events = events;
        router_->ApplyLoadReport(WorkerId(w), v).IgnoreError();
        reports_.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(100000 / kWorkers));
      }
    }
  }

  Router* const router_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reports_{0};
  std::thread thread_;
};

void ReportDistribution(benchmark::State& state, std::vector<double>& ns) {
  if (ns.empty()) return;
  // When the slowest decision happened (0 = first timed one): early ones
  // point at warm-up (tables growing to their steady size).
  const double slowest_at =
      static_cast<double>(std::max_element(ns.begin(), ns.end()) - ns.begin());
  state.counters["slowest_at"] = benchmark::Counter(slowest_at, benchmark::Counter::kAvgThreads);
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const size_t i = std::min(ns.size() - 1, static_cast<size_t>(q * (ns.size() - 1) + 0.5));
    return ns[i] / 1000.0;
  };
  // With several threads each reports its own distribution; the counters
  // show the mean over the threads.
  const auto avg = benchmark::Counter::kAvgThreads;
  state.counters["p50_us"] = benchmark::Counter(at(0.50), avg);
  state.counters["p90_us"] = benchmark::Counter(at(0.90), avg);
  state.counters["p99_us"] = benchmark::Counter(at(0.99), avg);
  state.counters["p999_us"] = benchmark::Counter(at(0.999), avg);
  state.counters["max_us"] = benchmark::Counter(ns.back() / 1000.0, avg);
  // The share the live histogram's 100 us bucket would hold.
  const double le_100us =
      static_cast<double>(std::upper_bound(ns.begin(), ns.end(), 100000.0) - ns.begin());
  state.counters["le_100us_fraction"] =
      benchmark::Counter(le_100us / static_cast<double>(ns.size()), avg);
  state.counters["decisions"] = static_cast<double>(ns.size());
}

RouterOptions BenchOptions(PolicyKind kind) {
  RouterOptions o;
  o.policy.kind = kind;
  o.rng_seed = 7;
  // Reports come from the feeder (or not at all): keep every worker fresh.
  o.registry.load_staleness = absl::InfiniteDuration();
  return o;
}

// The timed loop of one routing thread: keeps `in_flight_target` requests in
// flight (each new request is routed and assigned, the oldest finishes) and
// times Route() or RouteAndAssign() per decision.
void RunDecisions(benchmark::State& state, Router& router, const Workload& wl, bool time_assign,
                  size_t in_flight_target, uint32_t seed) {
  std::deque<RouteDecision> in_flight;
  std::vector<double> latencies;
  latencies.reserve(state.max_iterations);
  uint64_t n = seed;
  uint64_t cached_tokens = 0;
  std::mt19937 rng(seed);
  std::vector<TokenId> prompt;
  // Request i: session i % kSessions, its shared prefix, 512 fresh tokens.
  auto request_for = [&](uint64_t i) {
    const std::vector<TokenId>& prefix = wl.prefixes[i % kSessions % kPrefixes];
    prompt.assign(prefix.begin(), prefix.end());
    for (int t = 0; t < kUniqueTokens; ++t) prompt.push_back(static_cast<TokenId>(rng() % 151000));
    RouteRequest req;
    req.token_ids = prompt;
    req.routing_key = wl.keys[i % kSessions];
    return req;
  };
  while (in_flight.size() < in_flight_target) {
    absl::StatusOr<RouteDecision> d = router.RouteAndAssign(request_for(n++));
    if (!d.ok()) std::abort();
    in_flight.push_back(std::move(*d));
  }
  for (auto _ : state) {
    const RouteRequest req = request_for(n++);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<RouteDecision> d = time_assign ? router.RouteAndAssign(req) : router.Route(req);
    const auto stop = std::chrono::steady_clock::now();
    if (!d.ok()) {
      state.SkipWithError(std::string(d.status().message()).c_str());
      break;
    }
    const double ns = std::chrono::duration<double, std::nano>(stop - start).count();
    latencies.push_back(ns);
    state.SetIterationTime(ns * 1e-9);
    cached_tokens += d->cached_tokens;
    if (!time_assign && !router.OnAssigned(&*d)) continue;
    router.OnFinished(in_flight.front());
    in_flight.pop_front();
    in_flight.push_back(std::move(*d));
  }
  ReportDistribution(state, latencies);
  state.counters["cached_tokens_per_request"] = benchmark::Counter(
      latencies.empty() ? 0 : static_cast<double>(cached_tokens) / latencies.size(),
      benchmark::Counter::kAvgThreads);
  state.counters["in_flight"] = static_cast<double>(in_flight.size());
  for (const RouteDecision& d : in_flight) router.OnFinished(d);
}

void SetCommonCounters(benchmark::State& state) {
  state.counters["workers"] = benchmark::Counter(kWorkers, benchmark::Counter::kAvgThreads);
  state.counters["prompt_tokens"] =
      benchmark::Counter(kPrefixTokens + kUniqueTokens, benchmark::Counter::kAvgThreads);
}

void RunSteadyState(benchmark::State& state, bool time_assign, bool feeder_on, PolicyKind kind) {
  Router router(BenchOptions(kind));
  const Workload wl = Setup(router, 1);
  std::unique_ptr<Feeder> feeder;
  if (feeder_on) feeder = std::make_unique<Feeder>(&router);
  RunDecisions(state, router, wl, time_assign, kInFlight, 5);
  SetCommonCounters(state);
  if (feeder) state.counters["load_reports_applied"] = static_cast<double>(feeder->reports());
}

void BM_Route(benchmark::State& state) {
  RunSteadyState(state, false, state.range(0) != 0, PolicyKind::kCost);
}
void BM_RouteAndAssign(benchmark::State& state) {
  RunSteadyState(state, true, state.range(0) != 0, PolicyKind::kCost);
}
void BM_RoutePolicy(benchmark::State& state) {
  RunSteadyState(state, false, false, static_cast<PolicyKind>(state.range(0)));
  state.SetLabel(std::string(PolicyKindName(static_cast<PolicyKind>(state.range(0)))));
}

// Several routing threads share one router (and the feeder): lock
// contention included. The 1,000 in-flight requests are split between them.
struct Shared {
  std::unique_ptr<Router> router;
  Workload wl;
  std::unique_ptr<Feeder> feeder;
};
Shared* g_shared = nullptr;

void SetupShared(const benchmark::State&) {
  g_shared = new Shared;
  g_shared->router = std::make_unique<Router>(BenchOptions(PolicyKind::kCost));
  g_shared->wl = Setup(*g_shared->router, 1);
  g_shared->feeder = std::make_unique<Feeder>(g_shared->router.get());
}

void TeardownShared(const benchmark::State&) {
  delete g_shared;
  g_shared = nullptr;
}

void BM_RouteAndAssignConcurrent(benchmark::State& state) {
  RunDecisions(state, *g_shared->router, g_shared->wl, true, kInFlight / state.threads(),
               17 + 1000 * state.thread_index());
  SetCommonCounters(state);
}

void BM_HashPrompt(benchmark::State& state) {
  std::mt19937 rng(3);
  const std::vector<TokenId> prompt = RandomTokens(rng, kPrefixTokens + kUniqueTokens);
  std::vector<uint64_t> hashes;
  for (auto _ : state) {
    ComputeBlockHashes(prompt, HashScheme{kBlockSize, 0}, &hashes);
    benchmark::DoNotOptimize(hashes.data());
  }
  state.counters["blocks"] = static_cast<double>(hashes.size());
}

constexpr int64_t kIterations = 100000;

BENCHMARK(BM_Route)
    ->Name("route/cost")
    ->ArgName("feeder")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(kIterations)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RouteAndAssign)
    ->Name("route_and_assign/cost")
    ->ArgName("feeder")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(kIterations)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RoutePolicy)
    ->Name("route/policy")
    ->Arg(static_cast<int>(PolicyKind::kCost))
    ->Arg(static_cast<int>(PolicyKind::kRoundRobin))
    ->Arg(static_cast<int>(PolicyKind::kLeastLoaded))
    ->Iterations(kIterations / 2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RouteAndAssignConcurrent)
    ->Name("route_and_assign/cost/feeder:1/concurrent")
    ->Setup(SetupShared)
    ->Teardown(TeardownShared)
    ->Threads(2)
    ->Iterations(kIterations / 2)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HashPrompt)->Name("hash_prompt/2048_tokens")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera::router

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  benchmark::AddCustomContext("command", absl::StrJoin(args, " "));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
