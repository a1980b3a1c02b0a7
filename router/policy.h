// Routing policies: given the workers that may take a request (candidates)
// and what each one has cached of the prompt, pick one.
//
//   - "cost" (default): the cost model below, session affinity, and the power
//     of two choices among the near-best workers.
//   - "round_robin": the next candidate after the last one chosen, by slot.
//   - "least_loaded": fewest outstanding requests (reported running + waiting
//     plus the router's assignments since the last report), ties at random.
// "round_robin" and "least_loaded" ignore the prefix cache and affinity; they
// are baselines to compare the cost policy against.
//
// Cost model. Units: prefill-token equivalents — the time a worker needs to
// prefill one prompt token. For candidate w and a request of P prompt tokens
// of which C(w) are cached on w:
//
//   cost(w) = prefill        * (P - C(w))                    this request's prefill
//           + queued_prefill * (waiting prefill tokens on w)  work ahead of it
//           + running        * (running requests on w)        decode interference
//           + waiting        * (waiting requests on w)        per-request overhead
//           + kv_pressure    * max(0, (u - s) / (1 - s))      u = KV use, s = start
//
// For a kHigh request the two queue terms (queued_prefill, waiting) are
// scaled by high_priority_queue_factor: the worker schedules it ahead of
// lower-priority waiting requests, but its report does not split the queue
// by priority, so only part of the queue is assumed to be ahead of it.
//
// "Waiting prefill tokens" and "waiting requests" include the requests the
// router assigned since the worker's last load report (optimistic load), so
// a burst does not pile onto the worker that looked idlest a moment ago. The
// defaults treat a running sequence as 16 tokens of prefill and a queued
// request as 64 on top of its tokens; workers are assumed equally fast.
//
// Power of two choices. Costs computed from load reports are up to one
// report interval old, and many routers may act on the same numbers, so
// always taking the minimum herds. The policy keeps the near-best candidates
// (cost <= best + max(near_best_relative * best, near_best_absolute)),
// samples two of them at random and takes the cheaper (fewer router
// in-flight requests on a tie). With one near-best candidate it is chosen.
//
// Session affinity. A request with a routing key goes to the worker the key
// was last bound to, as long as that worker is a candidate and not
// overloaded: cost(sticky) <= overload_factor * cost(best) + overload_slack.
// Otherwise the policy chooses as usual and the key is bound to the choice.
// Keys are kept in an LRU of max_keys entries, dropped ttl after last use.
//
// Thread-safety: the Choose* functions are pure (apart from the RNG and the
// round-robin cursor they are handed); AffinityTable and SplitMix64 are not
// thread-safe (the Router guards them).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "router/priority.h"
#include "router/worker_registry.h"

namespace tessera::router {

enum class PolicyKind { kCost, kRoundRobin, kLeastLoaded };

// "cost" (also "cache_aware"), "round_robin", "least_loaded".
absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name);
std::string_view PolicyKindName(PolicyKind kind);

// Weights of the cost model, in prefill-token equivalents (see above).
struct CostWeights {
  double prefill = 1.0;         // per uncached prompt token of the request
  double queued_prefill = 1.0;  // per prompt token waiting for prefill on the worker
  double running = 16.0;        // per running request
  double waiting = 64.0;        // per waiting request
  double kv_pressure = 4096.0;  // at 100% KV use
  double kv_pressure_start = 0.9;
  double high_priority_queue_factor = 0.5;
};

struct AffinityOptions {
  bool enabled = true;
  double overload_factor = 1.5;
  double overload_slack = 2048.0;  // prefill-token equivalents
  size_t max_keys = 100000;
  absl::Duration ttl = absl::Minutes(30);
};

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kCost;
  CostWeights weights;
  double near_best_relative = 0.05;
  double near_best_absolute = 64.0;  // prefill-token equivalents
  AffinityOptions affinity;
};

// One routable worker as the policy sees it.
struct Candidate {
  int slot = 0;
  int64_t cached_tokens = 0;          // prompt tokens this worker has cached
  int64_t queued_prefill_tokens = 0;  // reported + router-pending
  int32_t running = 0;
  int32_t waiting = 0;        // reported + router-pending
  int32_t in_flight = 0;      // the router's own outstanding requests here
  double kv_utilization = 0;  // [0, 1]
};

// Why a worker was chosen.
enum class RouteReason { kCost, kAffinity, kRoundRobin, kLeastLoaded };
std::string_view RouteReasonName(RouteReason reason);

// The cost of the worker's current load (every term but the request's own
// prefill).
double LoadCost(const CostWeights& w, const Candidate& c, Priority priority = Priority::kNormal);
// The full cost of sending a request of `prompt_tokens` to `c`.
double Cost(const CostWeights& w, const Candidate& c, int64_t prompt_tokens,
            Priority priority = Priority::kNormal);

// A small fast PRNG (SplitMix64).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n). REQUIRES: n > 0.
  uint64_t Uniform(uint64_t n);

 private:
  uint64_t state_;
};

// Power of two choices among the near-best of `costs` (one per candidate).
// Returns an index into `candidates`. REQUIRES: !candidates.empty(),
// costs.size() == candidates.size().
size_t ChooseByCost(absl::Span<const Candidate> candidates, absl::Span<const double> costs,
                    const PolicyOptions& options, SplitMix64* rng);
// Fewest running + waiting; ties at random. REQUIRES: !candidates.empty().
size_t ChooseLeastLoaded(absl::Span<const Candidate> candidates, SplitMix64* rng);
// The first candidate whose slot follows *last_slot (wrapping), which it
// updates. REQUIRES: !candidates.empty(), candidates sorted by slot.
size_t ChooseRoundRobin(absl::Span<const Candidate> candidates, int* last_slot);

// Routing key -> worker bindings, LRU-bounded with a TTL.
class AffinityTable {
 public:
  AffinityTable(size_t max_keys, absl::Duration ttl) : max_keys_(max_keys), ttl_(ttl) {}

  // The worker bound to `key`, if the binding was used within the TTL.
  std::optional<WorkerRef> Lookup(std::string_view key, absl::Time now);
  // Binds (or re-binds) `key` to `worker`, as used now.
  void Bind(std::string_view key, const WorkerRef& worker, absl::Time now);
  void Erase(std::string_view key);
  size_t size() const { return map_.size(); }

 private:
  struct Item {
    std::string key;
    WorkerRef worker;
    absl::Time used;
  };
  void EvictExpired(absl::Time now);

  const size_t max_keys_;
  const absl::Duration ttl_;
  std::list<Item> lru_;  // most recent first
  absl::flat_hash_map<std::string, std::list<Item>::iterator> map_;
};

}  // namespace tessera::router
