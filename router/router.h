// Router: the routing core the gRPC adapter (services/router) drives. It
// ties together the worker registry (health, load, circuit breaker), the
// prefix index (exact from workers' events, predicted from routed prompts)
// and a routing policy, behind plain C++ types — no gRPC or protobuf.
//
// One Router serves one model: every registered worker is assumed to run
// the same model (run one Router per model).
//
// What the adapter feeds in, per worker:
//   1. AddWorker / RemoveWorker / Reconcile from the static list or the
//      file/DNS source.
//   2. SetWorkerInfo from Worker.GetInfo (block size, KV size). Call it
//      before feeding load reports: the block size decides how prompts are
//      hashed for this worker.
//   3. SetHealth from each grpc.health.v1 Watch message (full service name).
//   4. ApplyLoadReport for each WatchLoad message; subscribe with
//      include_snapshot = true. DATA_LOSS back means events were lost
//      (sequence gap): resubscribe with include_snapshot.
//      FAILED_PRECONDITION means the worker's events cannot be used (hash
//      mismatch, or events without a snapshot); the worker is then routed on
//      predictions until its next snapshot. Log both; neither is fatal.
//   5. RecordSuccess when a Generate stream delivers its first response;
//      RecordFailure for connect errors and broken streams (retry.h's
//      CountsAsWorkerFailure says which statuses count).
//
// Per request:
//   decision = RouteAndAssign(request)       // or Route + OnAssigned
//   ... call decision.worker_id ...
//   OnFinished(decision)                      // exactly once, however it ended
//
// Thread-safety: thread-safe. Route may run on many threads at once; each
// worker's load reports must come from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "router/clock.h"
#include "router/policy.h"
#include "router/prefix_hash.h"
#include "router/prefix_index.h"
#include "router/priority.h"
#include "router/worker_registry.h"

namespace tessera::router {

struct RouterOptions {
  RegistryOptions registry;
  PrefixIndexOptions index;  // index.max_workers is set from registry.max_workers
  PolicyOptions policy;
  // Block size assumed for a worker until SetWorkerInfo gives its own.
  int default_block_size = 16;
  // Seed of the policy's random choices; 0 = from the clock.
  uint64_t rng_seed = 0;
};

// One LoadReport (worker.proto) as plain values and views.
struct LoadReportView {
  uint64_t sequence = 0;  // 0 = unknown (no gap detection)
  WorkerLoad load;
  bool events_reset = false;
  absl::Span<const BlockEvent> events;
};

struct RouteRequest {
  // The tokens the worker will be asked to prefill: the prompt, plus the
  // tokens already generated when a request resumes elsewhere.
  absl::Span<const TokenId> token_ids;
  // Optional: block hashes of token_ids computed earlier with
  // `hashes_scheme` (reused for workers with that scheme; others are hashed
  // from token_ids).
  absl::Span<const uint64_t> block_hashes;
  HashScheme hashes_scheme;
  // Number of prompt tokens; -1 = token_ids.size(). Set it when only
  // block_hashes are given.
  int64_t prompt_tokens = -1;
  // Session affinity key; empty = none.
  std::string_view routing_key;
  Priority priority = Priority::kNormal;
  // Worker ids not to use (already tried for this request).
  absl::Span<const std::string> exclude;
};

struct RouteDecision {
  std::string worker_id;
  WorkerRef worker;
  RouteReason reason = RouteReason::kCost;
  // The worker's circuit breaker is half-open and this request is its probe.
  bool probe = false;
  int64_t prompt_tokens = 0;
  // Prompt tokens expected to be served from the worker's prefix cache (the
  // prefix-hit tokens metric); the worker always recomputes the last block
  // of a fully cached prompt, and this accounts for it.
  int64_t cached_tokens = 0;
  // The chosen worker's cost (cost policy; 0 for the others).
  double cost = 0;
  int candidates = 0;  // workers that could take the request
  // Carried to OnAssigned: the affinity key and the prompt's block hashes
  // under the chosen worker's hash scheme.
  std::string routing_key;
  HashScheme scheme;
  std::vector<uint64_t> block_hashes;
  // Set by OnAssigned: the worker's load-report epoch at assignment.
  uint64_t assigned_epoch = WorkerRegistry::kNoEpoch;
};

// A worker's registry status and index statistics (metrics, debugging).
struct WorkerReport {
  WorkerStatus status;
  SlotIndexStats index;
};

class Router {
 public:
  // REQUIRES: `clock` outlives the router.
  explicit Router(RouterOptions options, const Clock* clock = SystemClock::Get());

  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // --- Membership ---------------------------------------------------------
  absl::Status AddWorker(std::string_view id);
  // False when the worker was not registered. Requests in flight on it are
  // unaffected; their OnFinished calls become no-ops.
  bool RemoveWorker(std::string_view id);
  ReconcileResult Reconcile(const std::vector<std::string>& addresses);

  // --- Feeding ------------------------------------------------------------
  absl::Status SetWorkerInfo(std::string_view id, const WorkerStaticInfo& info);
  absl::Status SetHealth(std::string_view id, HealthState state);
  absl::Status ApplyLoadReport(std::string_view id, const LoadReportView& report);
  void RecordSuccess(std::string_view id);
  void RecordFailure(std::string_view id);

  // --- Routing ------------------------------------------------------------
  // Chooses a worker; records nothing. UNAVAILABLE, with a count of the
  // reasons, when no worker can take the request.
  absl::StatusOr<RouteDecision> Route(const RouteRequest& request);
  // Commits a decision: in-flight and pending load, the routed prompt's
  // predicted blocks, the affinity binding, the breaker probe. False (and
  // nothing recorded) when the decision went stale — the worker was removed
  // or ejected, or its one probe was taken meanwhile; route again.
  bool OnAssigned(RouteDecision* decision);
  // Route + OnAssigned, routing again (a few times) if the decision went
  // stale.
  absl::StatusOr<RouteDecision> RouteAndAssign(const RouteRequest& request);
  // Ends a request recorded by OnAssigned (whatever its outcome).
  void OnFinished(const RouteDecision& decision);

  // --- Introspection ------------------------------------------------------
  std::vector<WorkerReport> Report() const;
  PolicyKind policy() const { return options_.policy.kind; }
  const WorkerRegistry& registry() const { return registry_; }
  const PrefixIndex& index() const { return index_; }

 private:
  struct Scratch;

  // One decision; ABORTED when the chosen worker was removed meanwhile.
  absl::StatusOr<RouteDecision> RouteOnce(const RouteRequest& request);
  // Picks s.chosen among the candidates (s.costs filled for the cost
  // policy); sets the decision's reason and cost.
  void ChooseLocked(const RouteRequest& request, Scratch& s, RouteDecision* decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rest of the decision, from the chosen candidate (no lock).
  void FillDecision(const RouteRequest& request, int64_t prompt_tokens, const Scratch& s,
                    RouteDecision* decision) const;

  const RouterOptions options_;
  const Clock* const clock_;
  WorkerRegistry registry_;
  PrefixIndex index_;

  // Serializes membership changes, so that the registry and the index agree
  // on who owns a slot.
  absl::Mutex membership_mu_;

  // The policy's shared state; held only for the choice itself (costs are
  // computed before it is taken) and for binding a routing key.
  absl::Mutex mu_;
  SplitMix64 rng_ ABSL_GUARDED_BY(mu_);
  int rr_last_slot_ ABSL_GUARDED_BY(mu_) = -1;
  AffinityTable affinity_ ABSL_GUARDED_BY(mu_);
  // Incarnations whose events failed hash verification; their events are
  // ignored until a snapshot verifies. (The feeders' lock, not the routes'.)
  absl::Mutex untrusted_mu_;
  absl::flat_hash_set<uint64_t> untrusted_events_ ABSL_GUARDED_BY(untrusted_mu_);
};

}  // namespace tessera::router
