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
      num_slots_((std::max(1, options_.max_workers) + 63) / 64 * 64) {
  slots_.resize(num_slots_);
  exact_masks_.resize(num_slots_ / 64);
  predicted_masks_.resize(num_slots_ / 64);
}

void PrefixIndex::SetBit(MaskMap& map, uint64_t hash, int slot) {
  map.FindOrInsert(hash) |= uint64_t{1} << (slot & 63);
}

void PrefixIndex::ClearBit(MaskMap& map, uint64_t hash, int slot) {
  uint64_t* mask = map.Find(hash);
  if (mask == nullptr) return;
  *mask &= ~(uint64_t{1} << (slot & 63));
  if (*mask == 0) map.Erase(hash);
}

int64_t PrefixIndex::PredictedCapacityLocked(const SlotState& s) const {
  if (s.mode == IndexMode::kExact) return options_.pending_max_blocks;
  return s.approx_capacity > 0 ? s.approx_capacity : options_.approx_max_blocks;
}

absl::Duration PrefixIndex::PredictedTtl(const SlotState& s) const {
  return s.mode == IndexMode::kExact ? options_.pending_ttl : options_.approx_ttl;
}

bool PrefixIndex::DrainExactLocked(int slot, int budget) {
  SlotState& s = slots_[slot];
  MaskMap& masks = exact_masks_[slot / 64];
  std::vector<uint64_t> keys;
  s.exact.Keys(static_cast<size_t>(std::max(0, budget)), &keys);
  for (uint64_t h : keys) {
    ClearBit(masks, h, slot);
    s.exact.Erase(h);
  }
  if (s.exact.empty()) s.exact.Clear();  // give the memory back
  return s.exact.empty();
}

bool PrefixIndex::DrainPredictedLocked(int slot, int budget) {
  SlotState& s = slots_[slot];
  MaskMap& masks = predicted_masks_[slot / 64];
  for (; !s.predicted.empty() && budget > 0; --budget) {
    ClearBit(masks, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
  return s.predicted.empty();
}

void PrefixIndex::DrainInChunks(int slot, uint64_t incarnation, bool exact) {
  const int chunk = std::max(1, options_.apply_chunk);
  while (true) {
    absl::MutexLock lock(&mu_);
    if (slots_[slot].incarnation != incarnation) return;
    const bool done = exact ? DrainExactLocked(slot, chunk) : DrainPredictedLocked(slot, chunk);
    if (done) return;
  }
}

void PrefixIndex::ResetSlot(int slot, uint64_t incarnation) {
  if (slot < 0 || slot >= num_slots_) return;
  {
    absl::MutexLock lock(&mu_);
    SlotState& s = slots_[slot];
    s.incarnation = incarnation;
    s.mode = IndexMode::kApproximate;
    s.approx_capacity = 0;
  }
  DrainInChunks(slot, incarnation, /*exact=*/true);
  DrainInChunks(slot, incarnation, /*exact=*/false);
}

void PrefixIndex::SetCapacity(int slot, uint64_t incarnation, int64_t max_blocks) {
  if (slot < 0 || slot >= num_slots_) return;
  absl::MutexLock lock(&mu_);
  SlotState& s = slots_[slot];
  if (s.incarnation != incarnation) return;
  s.approx_capacity = std::max<int64_t>(0, max_blocks);
  const int64_t cap = PredictedCapacityLocked(s);
  MaskMap& masks = predicted_masks_[slot / 64];
  while (static_cast<int64_t>(s.predicted.size()) > cap) {
    ClearBit(masks, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
}

void PrefixIndex::ApplyHashLocked(int slot, BlockEvent::Kind kind, uint64_t hash) {
  SlotState& s = slots_[slot];
  const int group = slot / 64;
  if (kind == BlockEvent::Kind::kStored) {
    if (++s.exact.FindOrInsert(hash) == 1) SetBit(exact_masks_[group], hash, slot);
    // Confirmed: the prediction has done its job.
    if (s.predicted.Erase(hash)) ClearBit(predicted_masks_[group], hash, slot);
    return;
  }
  uint32_t* copies = s.exact.Find(hash);
  if (copies == nullptr) return;
  if (--*copies == 0) {
    s.exact.Erase(hash);
    ClearBit(exact_masks_[group], hash, slot);
  }
}

bool PrefixIndex::ApplyEvents(int slot, uint64_t incarnation, bool reset,
                              absl::Span<const BlockEvent> events) {
  if (slot < 0 || slot >= num_slots_) return false;
  bool drop_predictions = false;
  {
    absl::MutexLock lock(&mu_);
    SlotState& s = slots_[slot];
    if (s.incarnation != incarnation) return false;
    if (!reset && s.mode != IndexMode::kExact) return false;
    if (reset) {
      // Guesses made in approximate mode give way to the worker's own word;
      // predictions made in exact mode stay until confirmed or expired.
      drop_predictions = s.mode == IndexMode::kApproximate;
      s.mode = IndexMode::kExact;
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
    absl::MutexLock lock(&mu_);
    SlotState& s = slots_[slot];
    if (s.incarnation != incarnation || s.mode != IndexMode::kExact) return false;
    for (int budget = chunk; budget > 0 && e < events.size();) {
      const BlockEvent& event = events[e];
      if (h >= event.block_hashes.size()) {
        ++e;
        h = 0;
        continue;
      }
      ApplyHashLocked(slot, event.kind, event.block_hashes[h]);
      ++h;
      --budget;
    }
  }
  return true;
}

void PrefixIndex::FallBackToApproximate(int slot, uint64_t incarnation) {
  if (slot < 0 || slot >= num_slots_) return;
  {
    absl::MutexLock lock(&mu_);
    SlotState& s = slots_[slot];
    if (s.incarnation != incarnation) return;
    s.mode = IndexMode::kApproximate;
  }
  DrainInChunks(slot, incarnation, /*exact=*/true);
}

void PrefixIndex::PruneLocked(int slot, absl::Time now) {
  SlotState& s = slots_[slot];
  if (s.predicted.empty()) return;
  const absl::Time cutoff = now - PredictedTtl(s);
  MaskMap& masks = predicted_masks_[slot / 64];
  while (!s.predicted.empty() && s.predicted.oldest_time() < cutoff) {
    ClearBit(masks, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
}

void PrefixIndex::RecordRouted(int slot, uint64_t incarnation, absl::Span<const uint64_t> hashes) {
  if (slot < 0 || slot >= num_slots_ || hashes.empty()) return;
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  SlotState& s = slots_[slot];
  if (s.incarnation != incarnation) return;
  PruneLocked(slot, now);
  MaskMap& masks = predicted_masks_[slot / 64];
  // Deepest block first, so the first block ends most recent: eviction then
  // takes the tail of a chain before its head, as a worker's cache does. In
  // exact mode a prediction only bridges the time until the stored event,
  // so blocks the worker reported, or that are predicted already, are left
  // as they are (no refresh).
  const bool exact = s.mode == IndexMode::kExact;
  for (size_t i = hashes.size(); i-- > 0;) {
    const uint64_t h = hashes[i];
    if (exact && (s.exact.Contains(h) || s.predicted.Contains(h))) continue;
    if (s.predicted.Touch(h, now)) SetBit(masks, h, slot);
  }
  const int64_t cap = PredictedCapacityLocked(s);
  while (static_cast<int64_t>(s.predicted.size()) > cap) {
    ClearBit(masks, s.predicted.oldest_hash(), slot);
    s.predicted.PopOldest();
  }
}

void PrefixIndex::Match(absl::Span<const uint64_t> hashes, const SlotSet& among,
                        std::vector<int32_t>* matched) {
  if (matched->size() < static_cast<size_t>(num_slots_)) matched->resize(num_slots_, 0);
  int32_t* out = matched->data();
  const absl::Time now = clock_->Now();
  const int64_t now_ns = absl::ToUnixNanos(now);
  const int64_t last = last_prune_ns_.load(std::memory_order_relaxed);
  if (now_ns - last >= absl::ToInt64Nanoseconds(options_.prune_interval) || now_ns < last) {
    absl::MutexLock lock(&mu_);
    for (int slot = 0; slot < num_slots_; ++slot) PruneLocked(slot, now);
    last_prune_ns_.store(now_ns, std::memory_order_relaxed);
  }
  const absl::Span<const uint64_t> words = among.words();
  const int groups = std::min<int>(static_cast<int>(words.size()), num_slots_ / 64);
  const int32_t n = static_cast<int32_t>(hashes.size());
  absl::ReaderMutexLock lock(&mu_);
  for (int g = 0; g < groups; ++g) {
    uint64_t alive = words[g];
    if (alive == 0) continue;
    const MaskMap& exact = exact_masks_[g];
    const MaskMap& predicted = predicted_masks_[g];
    int32_t i = 0;
    for (; i < n && alive != 0; ++i) {
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
  absl::ReaderMutexLock lock(&mu_);
  const SlotState& s = slots_[slot];
  stats.mode = s.mode;
  stats.exact_blocks = static_cast<int64_t>(s.exact.size());
  stats.predicted_blocks = static_cast<int64_t>(s.predicted.size());
  return stats;
}

}  // namespace tessera::router
