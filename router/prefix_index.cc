#include "router/prefix_index.h"

#include <algorithm>
#include <utility>

namespace tessera::router {

// --- Lru ---------------------------------------------------------------------

void PrefixIndex::Lru::Unlink(int32_t i) {
  Node& n = nodes_[i];
  if (n.prev >= 0) {
    nodes_[n.prev].next = n.next;
  } else {
    head_ = n.next;
  }
  if (n.next >= 0) {
    nodes_[n.next].prev = n.prev;
  } else {
    tail_ = n.prev;
  }
  n.prev = n.next = -1;
}

void PrefixIndex::Lru::PushFront(int32_t i) {
  Node& n = nodes_[i];
  n.prev = -1;
  n.next = head_;
  if (head_ >= 0) nodes_[head_].prev = i;
  head_ = i;
  if (tail_ < 0) tail_ = i;
}

bool PrefixIndex::Lru::Touch(uint64_t hash, absl::Time now) {
  bool inserted = false;
  int32_t& where = where_.FindOrInsert(hash, &inserted);
  if (!inserted) {
    const int32_t i = where;
    nodes_[i].touched = now;
    if (head_ != i) {
      Unlink(i);
      PushFront(i);
    }
    return false;
  }
  int32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = static_cast<int32_t>(nodes_.size());
    nodes_.push_back(Node{});
  }
  nodes_[i] = Node{hash, now, -1, -1};
  PushFront(i);
  where = i;
  return true;
}

bool PrefixIndex::Lru::Erase(uint64_t hash) {
  const int32_t* where = where_.Find(hash);
  if (where == nullptr) return false;
  const int32_t i = *where;
  where_.Erase(hash);
  Unlink(i);
  free_.push_back(i);
  return true;
}

void PrefixIndex::Lru::PopOldest() {
  const int32_t i = tail_;
  where_.Erase(nodes_[i].hash);
  Unlink(i);
  free_.push_back(i);
}

// --- PrefixIndex ---------------------------------------------------------------

PrefixIndex::PrefixIndex(PrefixIndexOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      num_slots_((std::max(1, options_.max_workers) + 63) / 64 * 64),
      slots_(new SlotState[num_slots_]) {
  absl::MutexLock lock(&masks_mu_);
  exact_masks_.resize(num_slots_ / 64);
  predicted_masks_.resize(num_slots_ / 64);
}

namespace {
struct MaskOp {
  uint64_t hash;
  int32_t slot;
  bool exact;
  bool set;
};
// The calling thread's queued mask changes (empty between public calls).
thread_local std::vector<MaskOp> t_mask_ops;
}  // namespace

void PrefixIndex::SetBit(bool exact, uint64_t hash, int slot) {
  t_mask_ops.push_back(MaskOp{hash, slot, exact, true});
  if (t_mask_ops.size() >= kMaxMaskOpsPerHold) FlushMaskOps();
}

void PrefixIndex::ClearBit(bool exact, uint64_t hash, int slot) {
  t_mask_ops.push_back(MaskOp{hash, slot, exact, false});
  if (t_mask_ops.size() >= kMaxMaskOpsPerHold) FlushMaskOps();
}

void PrefixIndex::FlushMaskOps() {
  std::vector<MaskOp>& ops = t_mask_ops;
  if (ops.empty()) return;
  {
    absl::MutexLock lock(&masks_mu_);
    for (const MaskOp& op : ops) {
      MaskMap& map = (op.exact ? exact_masks_ : predicted_masks_)[op.slot / 64];
      const uint64_t bit = uint64_t{1} << (op.slot & 63);
      if (op.set) {
        map.FindOrInsert(op.hash) |= bit;
        continue;
      }
      uint64_t* mask = map.Find(op.hash);
      if (mask == nullptr) continue;
      *mask &= ~bit;
      if (*mask == 0) map.Erase(op.hash);
    }
  }
  ops.clear();
}

int64_t PrefixIndex::PredictedCapacityLocked(const SlotState& s) const {
  if (s.mode == IndexMode::kExact) return options_.pending_max_blocks;
  return s.approx_capacity > 0 ? s.approx_capacity : options_.approx_max_blocks;
}

absl::Duration PrefixIndex::PredictedTtlLocked(const SlotState& s) const {
  return s.mode == IndexMode::kExact ? options_.pending_ttl : options_.approx_ttl;
}

void PrefixIndex::UpdatePruneDueLocked(SlotState& s) {
  int64_t due = INT64_MAX;
  if (!s.predicted.empty()) {
    const absl::Time t =
        s.predicted.oldest_time() + PredictedTtlLocked(s) + options_.prune_interval;
    if (t < absl::InfiniteFuture()) due = absl::ToUnixNanos(t);
  }
  s.prune_due_ns.store(due, std::memory_order_relaxed);
}

bool PrefixIndex::DrainExactLocked(SlotState& s, int slot, int budget) {
  std::vector<uint64_t> keys;
  s.exact.Keys(static_cast<size_t>(std::max(0, budget)), &keys);
  for (uint64_t h : keys) {
    ClearBit(/*exact=*/true, h, slot);
    s.exact.Erase(h);
  }
  if (s.exact.empty()) s.exact.Clear();  // give the memory back
  return s.exact.empty();
}

bool PrefixIndex::DrainPredictedLocked(SlotState& s, int slot, int budget) {
  for (; !s.predicted.empty() && budget > 0; --budget) {
    ClearBit(/*exact=*/false, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
  UpdatePruneDueLocked(s);
  return s.predicted.empty();
}

void PrefixIndex::DrainInChunks(int slot, uint64_t incarnation, bool exact) {
  const int chunk = std::max(1, options_.apply_chunk);
  SlotState& s = slots_[slot];
  while (true) {
    absl::MutexLock lock(&s.mu);
    FlushOnExit flush{this};
    if (s.incarnation != incarnation) return;
    const bool done =
        exact ? DrainExactLocked(s, slot, chunk) : DrainPredictedLocked(s, slot, chunk);
    if (done) return;
  }
}

void PrefixIndex::ResetSlot(int slot, uint64_t incarnation) {
  if (slot < 0 || slot >= num_slots_) return;
  {
    SlotState& s = slots_[slot];
    absl::MutexLock lock(&s.mu);
    FlushOnExit flush{this};
    s.incarnation = incarnation;
    s.mode = IndexMode::kApproximate;
    s.approx_capacity = 0;
    UpdatePruneDueLocked(s);
  }
  DrainInChunks(slot, incarnation, /*exact=*/true);
  DrainInChunks(slot, incarnation, /*exact=*/false);
}

void PrefixIndex::SetCapacity(int slot, uint64_t incarnation, int64_t max_blocks) {
  if (slot < 0 || slot >= num_slots_) return;
  SlotState& s = slots_[slot];
  absl::MutexLock lock(&s.mu);
  FlushOnExit flush{this};
  if (s.incarnation != incarnation) return;
  s.approx_capacity = std::max<int64_t>(0, max_blocks);
  const int64_t cap = PredictedCapacityLocked(s);
  while (static_cast<int64_t>(s.predicted.size()) > cap) {
    ClearBit(/*exact=*/false, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
  UpdatePruneDueLocked(s);
}

void PrefixIndex::ApplyHashLocked(SlotState& s, int slot, BlockEvent::Kind kind, uint64_t hash) {
  if (kind == BlockEvent::Kind::kStored) {
    if (++s.exact.FindOrInsert(hash) == 1) SetBit(/*exact=*/true, hash, slot);
    // Confirmed: the prediction has done its job.
    if (s.predicted.Erase(hash)) ClearBit(/*exact=*/false, hash, slot);
    return;
  }
  uint32_t* copies = s.exact.Find(hash);
  if (copies == nullptr) return;
  if (--*copies == 0) {
    s.exact.Erase(hash);
    ClearBit(/*exact=*/true, hash, slot);
  }
}

bool PrefixIndex::ApplyEvents(int slot, uint64_t incarnation, bool reset,
                              absl::Span<const BlockEvent> events) {
  if (slot < 0 || slot >= num_slots_) return false;
  SlotState& s = slots_[slot];
  bool drop_predictions = false;
  {
    absl::MutexLock lock(&s.mu);
    FlushOnExit flush{this};
    if (s.incarnation != incarnation) return false;
    if (!reset && s.mode != IndexMode::kExact) return false;
    if (reset) {
      // Guesses made in approximate mode give way to the worker's own word;
      // predictions made in exact mode stay until confirmed or expired.
      drop_predictions = s.mode == IndexMode::kApproximate;
      s.mode = IndexMode::kExact;
      UpdatePruneDueLocked(s);
    }
  }
  if (reset) {
    DrainInChunks(slot, incarnation, /*exact=*/true);
    if (drop_predictions) DrainInChunks(slot, incarnation, /*exact=*/false);
  }
  const int chunk = std::max(1, options_.apply_chunk);
  size_t e = 0;  // event
  size_t h = 0;  // hash within the event
  while (e < events.size()) {
    absl::MutexLock lock(&s.mu);
    FlushOnExit flush{this};
    if (s.incarnation != incarnation || s.mode != IndexMode::kExact) return false;
    for (int budget = chunk; budget > 0 && e < events.size();) {
      const BlockEvent& event = events[e];
      if (h >= event.block_hashes.size()) {
        ++e;
        h = 0;
        continue;
      }
      ApplyHashLocked(s, slot, event.kind, event.block_hashes[h]);
      ++h;
      --budget;
    }
    UpdatePruneDueLocked(s);
  }
  return true;
}

void PrefixIndex::FallBackToApproximate(int slot, uint64_t incarnation) {
  if (slot < 0 || slot >= num_slots_) return;
  {
    SlotState& s = slots_[slot];
    absl::MutexLock lock(&s.mu);
    FlushOnExit flush{this};
    if (s.incarnation != incarnation) return;
    s.mode = IndexMode::kApproximate;
    UpdatePruneDueLocked(s);
  }
  DrainInChunks(slot, incarnation, /*exact=*/true);
}

void PrefixIndex::PruneLocked(SlotState& s, int slot, absl::Time now) {
  if (s.predicted.empty()) return;
  const absl::Time cutoff = now - PredictedTtlLocked(s);
  while (!s.predicted.empty() && s.predicted.oldest_time() < cutoff) {
    ClearBit(/*exact=*/false, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
  UpdatePruneDueLocked(s);
}

void PrefixIndex::PrunePredictions(int slot, uint64_t incarnation) {
  if (slot < 0 || slot >= num_slots_) return;
  SlotState& s = slots_[slot];
  const absl::Time now = clock_->Now();
  // Nothing expires before prune_due_ns - prune_interval.
  const int64_t due = s.prune_due_ns.load(std::memory_order_relaxed);
  if (due == INT64_MAX ||
      absl::ToUnixNanos(now) < due - absl::ToInt64Nanoseconds(options_.prune_interval)) {
    return;
  }
  absl::MutexLock lock(&s.mu);
  FlushOnExit flush{this};
  if (s.incarnation != incarnation) return;
  PruneLocked(s, slot, now);
}

void PrefixIndex::RecordRouted(int slot, uint64_t incarnation, absl::Span<const uint64_t> hashes) {
  if (slot < 0 || slot >= num_slots_ || hashes.empty()) return;
  const absl::Time now = clock_->Now();
  SlotState& s = slots_[slot];
  absl::MutexLock lock(&s.mu);
  FlushOnExit flush{this};
  if (s.incarnation != incarnation) return;
  PruneLocked(s, slot, now);
  // Deepest block first, so the first block ends most recent: eviction then
  // takes the tail of a chain before its head, as a worker's cache does. In
  // exact mode a prediction only bridges the time until the stored event,
  // so blocks the worker reported, or that are predicted already, are left
  // as they are (no refresh).
  const bool exact = s.mode == IndexMode::kExact;
  for (size_t i = hashes.size(); i-- > 0;) {
    const uint64_t h = hashes[i];
    if (exact && (s.exact.Contains(h) || s.predicted.Contains(h))) continue;
    if (s.predicted.Touch(h, now)) SetBit(/*exact=*/false, h, slot);
  }
  const int64_t cap = PredictedCapacityLocked(s);
  while (static_cast<int64_t>(s.predicted.size()) > cap) {
    ClearBit(/*exact=*/false, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
  UpdatePruneDueLocked(s);
}

void PrefixIndex::Match(absl::Span<const uint64_t> hashes, const SlotSet& among,
                        std::vector<int32_t>* matched) {
  if (matched->size() < static_cast<size_t>(num_slots_)) matched->resize(num_slots_, 0);
  int32_t* out = matched->data();
  const absl::Span<const uint64_t> words = among.words();
  const int groups = std::min<int>(static_cast<int>(words.size()), num_slots_ / 64);

  // Prune the candidates whose predictions are overdue, unless their writer
  // is at work (it prunes them itself).
  const absl::Time now = clock_->Now();
  const int64_t now_ns = absl::ToUnixNanos(now);
  for (int g = 0; g < groups; ++g) {
    for (uint64_t w = words[g]; w != 0; w &= w - 1) {
      const int slot = g * 64 + __builtin_ctzll(w);
      SlotState& s = slots_[slot];
      if (now_ns < s.prune_due_ns.load(std::memory_order_relaxed)) continue;
      if (!s.mu.TryLock()) continue;
      PruneLocked(s, slot, now);
      FlushMaskOps();
      s.mu.Unlock();
    }
  }

  const int32_t n = static_cast<int32_t>(hashes.size());
  absl::ReaderMutexLock lock(&masks_mu_);
  for (int g = 0; g < groups; ++g) {
    uint64_t alive = words[g];
    if (alive == 0) continue;
    const MaskMap& exact = exact_masks_[g];
    const MaskMap& predicted = predicted_masks_[g];
    // The tables are large and, on a live router, mostly out of cache
    // between decisions: prefetch a few blocks ahead so the misses overlap.
    constexpr int32_t kAhead = 8;
    for (int32_t k = 0; k < std::min(n, kAhead); ++k) {
      exact.Prefetch(hashes[k]);
      predicted.Prefetch(hashes[k]);
    }
    int32_t i = 0;
    for (; i < n && alive != 0; ++i) {
      if (i + kAhead < n) {
        exact.Prefetch(hashes[i + kAhead]);
        predicted.Prefetch(hashes[i + kAhead]);
      }
      uint64_t held = 0;
      if (!exact.empty()) {
        if (const uint64_t* m = exact.Find(hashes[i])) held = *m;
      }
      if (!predicted.empty()) {
        if (const uint64_t* m = predicted.Find(hashes[i])) held |= *m;
      }
      for (uint64_t lost = alive & ~held; lost != 0; lost &= lost - 1) {
        out[g * 64 + __builtin_ctzll(lost)] = i;
      }
      alive &= held;
    }
    for (; alive != 0; alive &= alive - 1) out[g * 64 + __builtin_ctzll(alive)] = n;
  }
}

SlotIndexStats PrefixIndex::Stats(int slot) const {
  SlotIndexStats stats;
  if (slot < 0 || slot >= num_slots_) return stats;
  const SlotState& s = slots_[slot];
  absl::ReaderMutexLock lock(&s.mu);
  stats.mode = s.mode;
  stats.exact_blocks = static_cast<int64_t>(s.exact.size());
  stats.predicted_blocks = static_cast<int64_t>(s.predicted.size());
  return stats;
}

}  // namespace tessera::router
