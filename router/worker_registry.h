// WorkerRegistry: the router's set of upstream workers and everything it
// knows about each one — health (from grpc.health.v1 Watch), the latest load
// report (from Worker.WatchLoad), its hash scheme (from Worker.GetInfo), a
// circuit breaker fed by request outcomes, and the router's own in-flight
// assignments.
//
// Identity. A worker is named by its address string ("host:port"). Each
// worker also gets a small integer slot (dense, reused after removal) so the
// prefix index and the policy can use bitsets and arrays, and an incarnation
// number that is never reused: a WorkerRef {slot, incarnation} taken before a
// worker was removed (or removed and added again) no longer matches, and
// calls made with it are ignored. Removing a worker that has requests in
// flight is safe: it stops receiving new ones, and the OnFinished calls of
// its old requests become no-ops.
//
// Routable. A worker can take a new request when all of these hold:
//   - health is SERVING (UNKNOWN until the first health report),
//   - its last load report did not say `draining`,
//   - its circuit breaker is closed, or half-open with no probe in flight,
//   - it was heard from (load report, health report or a request success)
//     within `load_staleness`.
// The staleness bound: a worker whose load stream stalls (a SIGSTOP'd or
// wedged process keeps its TCP connection open, so the health stream alone
// does not notice) stops receiving new requests at most `load_staleness`
// after the last thing heard from it. The check is made at every Snapshot
// (every route decision), not by a timer, so there is no extra delay. A
// worker that was never heard from counts from the moment it was added.
//
// Circuit breaker (outlier ejection). RecordFailure counts consecutive
// failures; at `failures_to_eject` the worker is ejected (breaker open) for
// base_ejection * ejection_multiplier^(k-1), capped at max_ejection, where k
// counts ejections since the breaker last closed. When the time is up the
// breaker is half-open: exactly one request (a probe) may be routed there.
// RecordSuccess while half-open closes the breaker and resets k; a failure
// ejects again with the next back-off. At most max_ejected_percent of the
// workers (but always at least one) are ejected at a time, so a cluster-wide
// problem degrades to retries instead of refusing everything.
//
// Thread-safety: thread-safe. Writers serialize on one internal mutex (none
// calls out while holding it). The route decision's reads (Snapshot, IdOf)
// take no lock: writers publish an immutable copy of the workers' state
// (swapped atomically, RCU style) whenever something a decision sees
// changes, and the per-request counters (in flight, pending load, last heard)
// are per-slot atomics. A writer that is preempted therefore never holds up a
// route decision's snapshot; OnAssigned and OnFinished hold the writers'
// mutex for a few counter updates only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "router/clock.h"
#include "router/prefix_hash.h"

namespace tessera::router {

// grpc.health.v1 serving status of the worker's full service name.
enum class HealthState { kUnknown, kServing, kNotServing };
std::string_view HealthStateName(HealthState state);

enum class BreakerState { kClosed, kOpen, kHalfOpen };
std::string_view BreakerStateName(BreakerState state);

// The numbers of one LoadReport (worker.proto).
struct WorkerLoad {
  int32_t running_requests = 0;
  int32_t waiting_requests = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t waiting_prefill_tokens = 0;  // tokens queued for prefill
  bool draining = false;
};

// What GetInfo says about a worker. Zero means "not known".
struct WorkerStaticInfo {
  int kv_block_size = 0;          // tokens per KV block
  uint64_t prefix_hash_seed = 0;  // the seed of its block hashes
  int64_t kv_blocks_total = 0;
  int32_t context_length = 0;
};

// Names one incarnation of a worker (see the header comment).
struct WorkerRef {
  int slot = -1;
  uint64_t incarnation = 0;

  bool valid() const { return slot >= 0 && incarnation != 0; }
  friend bool operator==(const WorkerRef& a, const WorkerRef& b) {
    return a.slot == b.slot && a.incarnation == b.incarnation;
  }
};

// Why a worker cannot take a new request now.
enum class Unroutable : uint8_t {
  kNone = 0,
  kHealthUnknown,
  kNotServing,
  kDraining,
  kEjected,
  kProbeInFlight,  // half-open, and its one probe is out
  kStale,          // not heard from within load_staleness
};
std::string_view UnroutableName(Unroutable reason);

struct RegistryOptions {
  // Slots; Add beyond this fails with RESOURCE_EXHAUSTED.
  int max_workers = 256;
  // Consecutive failures that eject a worker. REQUIRES: >= 1.
  int failures_to_eject = 3;
  absl::Duration base_ejection = absl::Seconds(1);
  absl::Duration max_ejection = absl::Seconds(60);
  double ejection_multiplier = 2.0;  // REQUIRES: >= 1
  // Upper bound on the share of workers ejected at once (at least one may
  // always be ejected).
  int max_ejected_percent = 50;
  // A worker not heard from for longer than this is not routable.
  // absl::InfiniteDuration() turns the check off.
  absl::Duration load_staleness = absl::Seconds(2);
};

// One worker as a route decision sees it, copied under the lock. (Its id is
// not copied, to keep snapshots cheap: IdOf gives it.)
struct WorkerView {
  WorkerRef ref;
  Unroutable unroutable = Unroutable::kNone;
  bool excluded = false;   // named in Snapshot's `exclude`
  bool half_open = false;  // routable, but only as the breaker's probe
  bool info_known = false;
  WorkerStaticInfo info;
  bool load_known = false;  // a load report has arrived
  WorkerLoad load;
  // The router's own bookkeeping: requests assigned and not finished, and
  // the requests (and their uncached prefill tokens) assigned since the last
  // load report, which that report cannot reflect yet.
  int32_t in_flight = 0;
  int32_t pending_requests = 0;
  int64_t pending_prefill_tokens = 0;
};

// Everything about one worker, for metrics and debugging.
struct WorkerStatus {
  std::string id;
  WorkerRef ref;
  HealthState health = HealthState::kUnknown;
  BreakerState breaker = BreakerState::kClosed;
  Unroutable unroutable = Unroutable::kNone;
  int consecutive_failures = 0;
  absl::Time ejected_until = absl::InfinitePast();
  bool load_known = false;
  WorkerLoad load;
  absl::Time last_heard = absl::InfinitePast();
  int32_t in_flight = 0;
  uint64_t assigned_total = 0;
  uint64_t failures_total = 0;
  uint64_t ejections_total = 0;
};

// What ReportLoad tells the caller about the report it recorded.
struct LoadReportResult {
  WorkerRef ref;
  HashScheme scheme;  // the worker's scheme (the default block size if unknown)
  bool sequence_gap;  // not the successor of the previous report (and no reset)
};

struct ReconcileResult {
  std::vector<std::pair<std::string, WorkerRef>> added;
  std::vector<std::pair<std::string, WorkerRef>> removed;
  // Addresses that could not be added (no free slot, empty address).
  std::vector<std::pair<std::string, absl::Status>> rejected;
};

class WorkerRegistry {
 public:
  // `default_block_size` stands in for a worker's block size until its
  // GetInfo is known. REQUIRES: `clock` outlives the registry.
  explicit WorkerRegistry(RegistryOptions options, int default_block_size = 16,
                          const Clock* clock = SystemClock::Get());
  ~WorkerRegistry();

  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // --- Membership ---------------------------------------------------------
  // INVALID_ARGUMENT for an empty id, ALREADY_EXISTS, RESOURCE_EXHAUSTED
  // when every slot is taken.
  absl::StatusOr<WorkerRef> Add(std::string_view id);
  // The removed worker's ref, or nullopt when it was not registered.
  std::optional<WorkerRef> Remove(std::string_view id);
  // Makes the set equal to `addresses` (duplicates are ignored): adds the
  // new ones, removes the ones not listed.
  ReconcileResult Reconcile(const std::vector<std::string>& addresses);
  std::optional<WorkerRef> Find(std::string_view id) const;
  size_t size() const;

  // --- Feeding (from the adapter's streams) -------------------------------
  // NOT_FOUND for an unknown worker.
  absl::Status SetInfo(std::string_view id, const WorkerStaticInfo& info);
  absl::Status SetHealth(std::string_view id, HealthState state);
  // Records a load report: the load, "heard now", and clears the pending
  // assignments (the report reflects them from now on). `sequence` is the
  // report's number (0 = do not check for gaps).
  absl::StatusOr<LoadReportResult> ReportLoad(std::string_view id, const WorkerLoad& load,
                                              uint64_t sequence, bool events_reset);
  // Request outcomes for the circuit breaker. Success: the worker accepted a
  // request and produced output. Failure: a connect error or a broken
  // stream (see retry.h, CountsAsWorkerFailure). Unknown ids are ignored.
  void RecordSuccess(std::string_view id);
  void RecordFailure(std::string_view id);

  // --- Routing ------------------------------------------------------------
  // Replaces `out` with a view of every worker, in slot order, marking the
  // ones named in `exclude`.
  void Snapshot(std::vector<WorkerView>* out, absl::Span<const std::string> exclude = {}) const;
  // The id of the worker `ref` names, if it is still registered.
  std::optional<std::string> IdOf(const WorkerRef& ref) const;
  // Commits a decision: counts the request in flight (and pending until the
  // next load report, with its uncached prefill tokens). When `probe`, also
  // claims the half-open worker's one probe. False, and nothing recorded,
  // when `ref` is stale, the worker is ejected, or the probe is taken.
  // `*epoch` (optional) receives the worker's load-report epoch, for
  // OnFinished.
  bool OnAssigned(const WorkerRef& ref, int64_t prefill_tokens, bool probe,
                  uint64_t* epoch = nullptr);
  // Ends a request OnAssigned recorded. No-op for a stale ref. With the
  // epoch OnAssigned gave and the same prefill_tokens, a request that ends
  // before the next load report also leaves the pending load (no report
  // will ever show it).
  static constexpr uint64_t kNoEpoch = ~uint64_t{0};
  void OnFinished(const WorkerRef& ref, bool probe, uint64_t epoch = kNoEpoch,
                  int64_t prefill_tokens = 0);

  std::vector<WorkerStatus> Status() const;
  std::optional<WorkerStatus> StatusOf(std::string_view id) const;

 private:
  struct Entry;
  struct Counters;
  struct Published;

  Entry* FindLocked(std::string_view id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const WorkerRef& ref) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WorkerRef> AddLocked(std::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<WorkerRef> RemoveLocked(std::string_view id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The breaker's state at `now` (an open breaker whose time is up is
  // half-open); readers use it without writing.
  static BreakerState EffectiveBreaker(const Entry& e, absl::Time now);
  // Stores the effective state (writers only).
  void UpdateBreakerLocked(Entry& e, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `e` (a live entry or a published copy) cannot take a request now.
  Unroutable UnroutableAt(const Entry& e, absl::Time last_heard, absl::Time now) const;
  // The last-heard time of `e` from its slot's counters.
  absl::Time LastHeard(const Entry& e) const;
  // Publishes a copy of every entry for the lock-free readers.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MayEjectLocked(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EjectLocked(Entry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerStatus StatusLocked(const Entry& e, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  const int default_block_size_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  // Indexed by slot; null for a free slot.
  std::vector<std::unique_ptr<Entry>> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> slot_of_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  // Indexed by slot, never reallocated: written under mu_, read without it.
  std::unique_ptr<Counters[]> counters_;
  // The latest published copy (never null).
  std::atomic<std::shared_ptr<const Published>> published_;
};

}  // namespace tessera::router
