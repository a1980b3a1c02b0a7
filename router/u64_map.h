// U64Map: an open-addressing hash map from uint64_t keys (block hashes) to
// small values, for the prefix index's tables.
//
// Why not absl::flat_hash_map: the index's tables see a steady stream of
// inserts and erases (predictions come and go with every routed prompt,
// workers store and evict blocks). A tombstoning table then rebuilds itself
// in place every so often, an O(capacity) pause of milliseconds at the sizes
// the router runs at, taken while the index lock is held — exactly the
// route-decision tail latency this code must avoid. This table uses linear
// probing with backward-shift deletion: an erase leaves no tombstone, so at
// a steady size the table never rebuilds; it only grows (doubling) while its
// size reaches new highs.
//
// Keys are mixed with a per-process random seed before probing, so prompts
// crafted to give block hashes with colliding low bits cannot build long
// probe chains. Key 0 is stored outside the table (it marks empty slots).
//
// Thread-safety: not thread-safe (the prefix index guards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tessera::router {

// A seed for U64Map, different in every process.
uint64_t U64MapSeed();

template <typename V>
class U64Map {
 public:
  U64Map() : seed_(U64MapSeed()) {}

  size_t size() const { return size_ + (has_zero_ ? 1 : 0); }
  bool empty() const { return size() == 0; }

  const V* Find(uint64_t key) const {
    if (key == 0) return has_zero_ ? &zero_value_ : nullptr;
    if (slots_.empty()) return nullptr;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == 0) return nullptr;
    }
  }
  V* Find(uint64_t key) { return const_cast<V*>(std::as_const(*this).Find(key)); }
  bool Contains(uint64_t key) const { return Find(key) != nullptr; }

  // Starts loading the cache line where a lookup of `key` begins (a hint:
  // callers walking many keys prefetch a few ahead, so the misses overlap).
  void Prefetch(uint64_t key) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[Home(key)]);
  }

  // The value of `key`, inserted as V{} when absent (*inserted says which).
  V& FindOrInsert(uint64_t key, bool* inserted = nullptr) {
    if (key == 0) {
      if (inserted != nullptr) *inserted = !has_zero_;
      if (!has_zero_) zero_value_ = V{};
      has_zero_ = true;
      return zero_value_;
    }
    if ((size_ + 1) * 4 > slots_.size() * 3) Grow();
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        if (inserted != nullptr) *inserted = false;
        return slots_[i].value;
      }
      if (slots_[i].key == 0) break;
    }
    slots_[i].key = key;
    slots_[i].value = V{};
    ++size_;
    if (inserted != nullptr) *inserted = true;
    return slots_[i].value;
  }

  bool Erase(uint64_t key) {
    if (key == 0) {
      const bool had = has_zero_;
      has_zero_ = false;
      return had;
    }
    if (slots_.empty()) return false;
    size_t i = Home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == 0) return false;
    }
    // Backward shift: move later entries of the cluster into the hole when
    // their home position allows it.
    size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (slots_[j].key == 0) break;
      const size_t home = Home(slots_[j].key);
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i].key = 0;
    --size_;
    return true;
  }

  void Clear() {
    slots_.clear();
    mask_ = 0;
    shift_ = 64;
    size_ = 0;
    has_zero_ = false;
  }

  // Appends up to `n` keys to `out`.
  void Keys(size_t n, std::vector<uint64_t>* out) const {
    if (n > 0 && has_zero_) {
      out->push_back(0);
      --n;
    }
    for (size_t i = 0; i < slots_.size() && n > 0; ++i) {
      if (slots_[i].key != 0) {
        out->push_back(slots_[i].key);
        --n;
      }
    }
  }

  size_t capacity() const { return slots_.size(); }

 private:
  struct Slot {
    uint64_t key = 0;
    V value{};
  };

  size_t Home(uint64_t key) const {
    return static_cast<size_t>(((key ^ seed_) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    const size_t capacity = old.empty() ? 16 : old.size() * 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64 - __builtin_ctzll(capacity);
    for (const Slot& s : old) {
      if (s.key == 0) continue;
      size_t i = Home(s.key);
      while (slots_[i].key != 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  const uint64_t seed_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;  // keys in slots_ (key 0 not counted)
  bool has_zero_ = false;
  V zero_value_{};
};

}  // namespace tessera::router
