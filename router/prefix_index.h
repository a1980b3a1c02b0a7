// PrefixIndex: which workers hold which KV blocks in their prefix caches, so
// that a route decision knows, for every candidate worker, how many leading
// blocks of a prompt it would find cached.
//
// Two sources, one query:
//   - Exact: a worker's own prefix-cache events (LoadReport.events: stored /
//     removed block hashes; events_reset starts over from a snapshot). A
//     worker is in exact mode from its first reset on. A hash is counted per
//     worker (the worker may cache two blocks with one hash and report both),
//     so a removed event clears a worker's bit only when its last copy goes.
//   - Predicted: the block hashes of prompts the router sent to a worker
//     (RecordRouted), in a per-worker LRU with a TTL. For a worker that sends
//     no events (approximate mode) this is the whole index (long TTL, bounded
//     by its KV size); for a worker in exact mode it covers the time between
//     routing a prompt and the worker's stored event for it (short TTL), so a
//     burst of prompts with a new shared prefix lands on one worker. A stored
//     event for a hash drops the worker's prediction of it.
// A worker holds a block if either source says so.
//
// Layout, for fast queries: per group of 64 worker slots, a hash map from
// block hash to a 64-bit mask of the slots holding it (one map for exact
// blocks, one for predictions). The maps are U64Map (u64_map.h), whose
// erases leave no tombstones, so the steady churn of predictions and events
// never triggers an in-place rebuild under a lock. Match walks the prompt's
// hashes once, ANDing masks, and stops when no candidate is left: O(prompt
// blocks x 2 lookups) per group, whatever the number of workers in the group.
//
// Locking, so that a query never waits long for a writer (and a writer that
// is preempted holds up little):
//   - Each slot's own state (mode, exact copy counts, prediction LRU) has
//     its own mutex, taken by that slot's writers (its feeder, the requests
//     routed to it) and never by Match, except to prune (try-lock only).
//     Writers do their bookkeeping under it and queue the mask changes.
//   - The mask maps have one mutex. Match takes it shared, once, for its
//     whole walk. A writer takes it exclusively only to apply its queued
//     mask changes, at most kMaxMaskOpsPerHold at a time (a few
//     microseconds), so a query waits little for a writer.
//   - Large event batches (a snapshot of a whole cache) and resets are
//     applied in chunks of `apply_chunk` hashes per slot-lock hold.
// Lock order: a slot's mutex, then the masks' mutex.
//
// Expired predictions are dropped by the slot's writers (RecordRouted and
// PrunePredictions prune exactly at the TTL) and, when one is more than
// `prune_interval` past its TTL, by a query (when the slot's lock is free).
//
// Slots and incarnations are the registry's (worker_registry.h): a call made
// with an incarnation the slot no longer has is ignored.
//
// Thread-safety: thread-safe (see "Locking"). REQUIRES: for each slot,
// ApplyEvents calls come from one feeder at a time (its load stream).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "router/clock.h"
#include "router/prefix_hash.h"
#include "router/u64_map.h"

namespace tessera::router {

// A set of worker slots.
class SlotSet {
 public:
  explicit SlotSet(int max_slots = 256) : words_((std::max(1, max_slots) + 63) / 64, 0) {}
  void Set(int slot) { words_[slot >> 6] |= uint64_t{1} << (slot & 63); }
  void Clear(int slot) { words_[slot >> 6] &= ~(uint64_t{1} << (slot & 63)); }
  bool Test(int slot) const { return (words_[slot >> 6] >> (slot & 63)) & 1; }
  void ClearAll() { std::fill(words_.begin(), words_.end(), 0); }
  bool Empty() const {
    for (uint64_t w : words_) {
      if (w != 0) return false;
    }
    return true;
  }
  int capacity() const { return static_cast<int>(words_.size() * 64); }
  absl::Span<const uint64_t> words() const { return words_; }

 private:
  std::vector<uint64_t> words_;
};

// One prefix-cache event of a worker, as views into the caller's storage
// (for instance a protobuf's repeated fields).
struct BlockEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  absl::Span<const uint64_t> block_hashes;
  // For stored events: the hash before the first block (0 for a root), and
  // block_size token ids per hash (may be empty).
  uint64_t parent_hash = 0;
  absl::Span<const TokenId> token_ids;
};

enum class IndexMode { kApproximate, kExact };

struct PrefixIndexOptions {
  int max_workers = 256;  // slots; the registry's max_workers
  // Approximate mode: predicted blocks kept per worker (SetCapacity lowers
  // it to the worker's KV size), and for how long after last use.
  int64_t approx_max_blocks = int64_t{1} << 16;
  absl::Duration approx_ttl = absl::Seconds(120);
  // Exact mode: predictions not yet confirmed by a stored event.
  int64_t pending_max_blocks = int64_t{1} << 13;
  absl::Duration pending_ttl = absl::Seconds(5);
  // Hashes applied per hold of a slot's lock.
  int apply_chunk = 256;
  // Expired predictions are dropped by the slot's writers (RecordRouted,
  // PrunePredictions); a query prunes a slot whose oldest prediction is this
  // much past its TTL, so it may see a prediction up to this long after.
  absl::Duration prune_interval = absl::Milliseconds(100);
};

struct SlotIndexStats {
  IndexMode mode = IndexMode::kApproximate;
  int64_t exact_blocks = 0;      // distinct hashes from events
  int64_t predicted_blocks = 0;  // hashes in the prediction LRU
};

class PrefixIndex {
 public:
  // REQUIRES: `clock` outlives the index.
  explicit PrefixIndex(PrefixIndexOptions options, const Clock* clock = SystemClock::Get());

  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Forgets everything about `slot` and gives it to `incarnation` (0 when
  // the slot becomes free), in approximate mode.
  void ResetSlot(int slot, uint64_t incarnation);

  // Caps the worker's predicted blocks (approximate mode) at `max_blocks`,
  // e.g. its KV cache size; <= 0 restores the default.
  void SetCapacity(int slot, uint64_t incarnation, int64_t max_blocks);

  // Applies one load report's events. `reset`: forget the worker's exact
  // blocks first and enter exact mode (events_reset). Events arriving before
  // any reset are ignored (returns false): without a snapshot the index
  // cannot know what the worker already held. True when applied.
  bool ApplyEvents(int slot, uint64_t incarnation, bool reset, absl::Span<const BlockEvent> events);

  // Leaves exact mode (for instance after a hash mismatch): drops the
  // worker's exact blocks and predicts from routed prompts again.
  void FallBackToApproximate(int slot, uint64_t incarnation);

  // Records that a prompt with these block hashes was routed to the worker.
  void RecordRouted(int slot, uint64_t incarnation, absl::Span<const uint64_t> hashes);

  // Drops the worker's expired predictions (the feeder calls it with each
  // load report, so queries seldom have to). Cheap when none is due.
  void PrunePredictions(int slot, uint64_t incarnation);

  // For every slot in `among`, sets (*matched)[slot] to the number of
  // leading `hashes` the worker holds. Other entries are left alone; the
  // vector is grown to the slot capacity when smaller. Takes no lock
  // exclusively except to prune a slot whose lock is free.
  void Match(absl::Span<const uint64_t> hashes, const SlotSet& among,
             std::vector<int32_t>* matched);

  SlotIndexStats Stats(int slot) const;

 private:
  // A least-recently-used list of hashes with their last-use time, in a
  // vector with index links (no allocation per entry once warm).
  class Lru {
   public:
    // Marks `hash` used at `now` (most recent). True when it was not there.
    bool Touch(uint64_t hash, absl::Time now);
    bool Erase(uint64_t hash);
    bool empty() const { return where_.empty(); }
    bool Contains(uint64_t hash) const { return where_.Contains(hash); }
    size_t size() const { return where_.size(); }
    uint64_t oldest_hash() const { return nodes_[tail_].hash; }
    absl::Time oldest_time() const { return nodes_[tail_].touched; }
    void PopOldest();

   private:
    struct Node {
      uint64_t hash;
      absl::Time touched;
      int32_t prev;  // towards the most recent
      int32_t next;  // towards the oldest
    };
    void Unlink(int32_t i);
    void PushFront(int32_t i);
    std::vector<Node> nodes_;
    std::vector<int32_t> free_;
    U64Map<int32_t> where_;
    int32_t head_ = -1;
    int32_t tail_ = -1;
  };

  struct SlotState {
    mutable absl::Mutex mu;
    uint64_t incarnation ABSL_GUARDED_BY(mu) = 0;
    IndexMode mode ABSL_GUARDED_BY(mu) = IndexMode::kApproximate;
    U64Map<uint32_t> exact ABSL_GUARDED_BY(mu);  // hash -> copies held
    Lru predicted ABSL_GUARDED_BY(mu);
    int64_t approx_capacity ABSL_GUARDED_BY(mu) = 0;  // 0 = options_.approx_max_blocks
    // When a query should prune this slot (unix ns; INT64_MAX = nothing to
    // prune): its oldest prediction's expiry plus prune_interval. Written
    // under `mu`, read without it.
    std::atomic<int64_t> prune_due_ns{INT64_MAX};
  };

  using MaskMap = U64Map<uint64_t>;

  static constexpr int kMaxMaskOpsPerHold = 64;
  // Queue a change of a slot's bit in the exact or predicted masks (applied
  // at the latest by FlushMaskOps, in order). Callers hold the slot's lock
  // and flush before releasing it.
  void SetBit(bool exact, uint64_t hash, int slot);
  void ClearBit(bool exact, uint64_t hash, int slot);
  void FlushMaskOps() ABSL_LOCKS_EXCLUDED(masks_mu_);
  // Flushes when it goes out of scope (declare it after the slot's lock).
  struct FlushOnExit {
    PrefixIndex* index;
    ~FlushOnExit() { index->FlushMaskOps(); }
  };
  // Drops up to `budget` exact blocks of the slot; true when none is left.
  bool DrainExactLocked(SlotState& s, int slot, int budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Drops up to `budget` predictions of the slot; true when none is left.
  bool DrainPredictedLocked(SlotState& s, int slot, int budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void ApplyHashLocked(SlotState& s, int slot, BlockEvent::Kind kind, uint64_t hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void PruneLocked(SlotState& s, int slot, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  // Stores the slot's prune_due_ns after its predictions or mode changed.
  void UpdatePruneDueLocked(SlotState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  int64_t PredictedCapacityLocked(const SlotState& s) const ABSL_SHARED_LOCKS_REQUIRED(s.mu);
  absl::Duration PredictedTtlLocked(const SlotState& s) const ABSL_SHARED_LOCKS_REQUIRED(s.mu);
  // Drops all of the slot's blocks of one kind, in chunks, while the slot
  // keeps `incarnation`.
  void DrainInChunks(int slot, uint64_t incarnation, bool exact);

  const PrefixIndexOptions options_;
  const Clock* const clock_;
  const int num_slots_;

  std::unique_ptr<SlotState[]> slots_;
  mutable absl::Mutex masks_mu_;
  std::vector<MaskMap> exact_masks_ ABSL_GUARDED_BY(masks_mu_);      // per 64-slot group
  std::vector<MaskMap> predicted_masks_ ABSL_GUARDED_BY(masks_mu_);  // per 64-slot group
};

}  // namespace tessera::router
