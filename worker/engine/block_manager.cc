#include "worker/engine/block_manager.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tessera::engine {

absl::StatusOr<std::unique_ptr<BlockManager>> BlockManager::Create(
    const BlockManagerOptions& options) {
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be positive, got ", options.block_size));
  }
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_blocks must be positive, got ", options.num_blocks));
  }
  if (options.max_pending_event_hashes < 0) {
    return absl::InvalidArgumentError("max_pending_event_hashes must not be negative");
  }
  return std::unique_ptr<BlockManager>(new BlockManager(options));
}

BlockManager::BlockManager(const BlockManagerOptions& options)
    : options_(options), blocks_(options.num_blocks) {
  // A stack: block 0 is handed out first.
  free_uncached_.reserve(options.num_blocks);
  for (BlockId b = options.num_blocks - 1; b >= 0; --b) free_uncached_.push_back(b);
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s = counters_;
  s.num_total_blocks = num_total_blocks();
  s.num_free_blocks = num_free_blocks();
  s.num_used_blocks = num_used_blocks();
  s.num_cached_blocks = num_cached_;
  s.num_evictable_blocks = num_evictable_;
  return s;
}

// ---------------------------------------------------------------------------
// Free pool and LRU.

void BlockManager::LruPushBack(BlockId b) {
  Block& block = blocks_[b];
  block.lru_prev = lru_tail_;
  block.lru_next = -1;
  if (lru_tail_ >= 0) {
    blocks_[lru_tail_].lru_next = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
  block.in_lru = true;
  ++num_evictable_;
}

void BlockManager::LruRemove(BlockId b) {
  Block& block = blocks_[b];
  if (block.lru_prev >= 0) {
    blocks_[block.lru_prev].lru_next = block.lru_next;
  } else {
    lru_head_ = block.lru_next;
  }
  if (block.lru_next >= 0) {
    blocks_[block.lru_next].lru_prev = block.lru_prev;
  } else {
    lru_tail_ = block.lru_prev;
  }
  block.lru_prev = block.lru_next = -1;
  block.in_lru = false;
  --num_evictable_;
}

BlockId BlockManager::TakeFreeBlock() {
  if (!free_uncached_.empty()) {
    BlockId b = free_uncached_.back();
    free_uncached_.pop_back();
    return b;
  }
  BlockId b = lru_head_;
  LruRemove(b);
  Unregister(b);
  ++counters_.num_evictions;
  return b;
}

void BlockManager::Ref(BlockId b) {
  Block& block = blocks_[b];
  if (block.ref_count == 0 && block.in_lru) LruRemove(b);
  ++block.ref_count;
}

void BlockManager::Unref(BlockId b) {
  Block& block = blocks_[b];
  if (--block.ref_count > 0) return;
  if (block.cached) {
    LruPushBack(b);
  } else {
    free_uncached_.push_back(b);
  }
}

// ---------------------------------------------------------------------------
// Cache index.

uint64_t BlockManager::HashBlock(uint64_t parent_hash, absl::Span<const TokenId> tokens) const {
  if (options_.hash_for_testing) return options_.hash_for_testing(parent_hash, tokens);
  return HashBlockTokens(parent_hash, tokens, options_.hash_seed);
}

BlockId BlockManager::FindEntry(uint64_t hash, uint64_t parent_serial,
                                absl::Span<const TokenId> tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  for (BlockId b : it->second) {
    const Block& block = blocks_[b];
    if (block.parent_serial == parent_serial && absl::MakeConstSpan(block.tokens) == tokens) {
      return b;
    }
  }
  return -1;
}

void BlockManager::Register(BlockId b, uint64_t hash, uint64_t parent_hash, bool first_in_sequence,
                            uint64_t parent_serial, absl::Span<const TokenId> tokens) {
  Block& block = blocks_[b];
  block.cached = true;
  block.hash = hash;
  block.serial = next_serial_++;
  block.parent_serial = parent_serial;
  block.tokens.assign(tokens.begin(), tokens.end());
  cache_[hash].push_back(b);
  ++num_cached_;
  EmitStored(hash, parent_hash, first_in_sequence, tokens);
}

void BlockManager::Unregister(BlockId b) {
  Block& block = blocks_[b];
  auto it = cache_.find(block.hash);
  auto& entries = it->second;
  entries.erase(std::find(entries.begin(), entries.end(), b));
  if (entries.empty()) cache_.erase(it);
  EmitRemoved(block.hash);
  block.cached = false;
  block.hash = 0;
  block.serial = 0;
  block.parent_serial = 0;
  block.tokens.clear();
  --num_cached_;
}

PrefixMatch BlockManager::FindCachedPrefix(absl::Span<const TokenId> tokens) const {
  PrefixMatch match;
  match.version = version_;
  match.num_query_tokens = static_cast<int>(tokens.size());
  if (!options_.enable_prefix_caching || tokens.empty()) return match;
  const int bs = options_.block_size;
  // Leave the last token to compute: it must produce logits.
  match.num_query_blocks = static_cast<int>((tokens.size() - 1) / bs);
  uint64_t parent_hash = kRootParentHash;
  uint64_t parent_serial = 0;
  for (int i = 0; i < match.num_query_blocks; ++i) {
    auto chunk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const uint64_t hash = HashBlock(parent_hash, chunk);
    const BlockId b = FindEntry(hash, parent_serial, chunk);
    if (b < 0) break;
    match.blocks.push_back(b);
    if (blocks_[b].ref_count == 0) ++match.num_unreferenced;
    parent_hash = hash;
    parent_serial = blocks_[b].serial;
  }
  match.num_tokens = static_cast<int>(match.blocks.size()) * bs;
  return match;
}

absl::Status BlockManager::CacheComputedBlocks(SequenceId id, absl::Span<const TokenId> tokens,
                                               int num_computed_tokens) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  SeqBlocks& seq = it->second;
  if (num_computed_tokens < 0 || num_computed_tokens > seq.num_slots ||
      static_cast<size_t>(num_computed_tokens) > tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": ", num_computed_tokens,
                                                   " computed tokens, but it has ", seq.num_slots,
                                                   " slots and ", tokens.size(), " tokens"));
  }
  if (!options_.enable_prefix_caching) return absl::OkStatus();
  ++version_;
  const int bs = options_.block_size;
  const size_t num_full = static_cast<size_t>(num_computed_tokens / bs);
  for (size_t i = seq.hashes.size(); i < num_full; ++i) {
    const bool first = i == 0;
    const uint64_t parent_hash = first ? kRootParentHash : seq.hashes[i - 1];
    const uint64_t parent_serial = first ? 0 : seq.serials[i - 1];
    auto chunk = tokens.subspan(i * bs, bs);
    const uint64_t hash = HashBlock(parent_hash, chunk);
    const BlockId b = seq.blocks[i];
    const BlockId existing = FindEntry(hash, parent_serial, chunk);
    if (existing < 0) Register(b, hash, parent_hash, first, parent_serial, chunk);
    seq.hashes.push_back(hash);
    // A duplicate takes the serial of the equal entry: serials name content
    // (a verified prefix), so children registered by this sequence link to
    // the cached chain.
    seq.serials.push_back(blocks_[existing < 0 ? b : existing].serial);
  }
  return absl::OkStatus();
}

int BlockManager::ResetPrefixCache() {
  ++version_;
  int n = 0;
  while (lru_head_ >= 0) {
    BlockId b = lru_head_;
    LruRemove(b);
    Unregister(b);
    free_uncached_.push_back(b);
    ++counters_.num_evictions;
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------
// Events.

bool BlockManager::ReserveEventSpace() {
  if (pending_event_hashes_ >= options_.max_pending_event_hashes) {
    if (options_.max_pending_event_hashes > 0) ++counters_.num_events_dropped;
    return false;
  }
  ++pending_event_hashes_;
  return true;
}

void BlockManager::EmitStored(uint64_t hash, uint64_t parent_hash, bool first_in_sequence,
                              absl::Span<const TokenId> tokens) {
  if (!ReserveEventSpace()) return;
  if (!events_.empty() && !first_in_sequence) {
    KvCacheEvent& last = events_.back();
    if (last.kind == KvCacheEvent::Kind::kStored && last.block_hashes.back() == parent_hash) {
      last.block_hashes.push_back(hash);
      last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  KvCacheEvent event;
  event.kind = KvCacheEvent::Kind::kStored;
  event.block_hashes.push_back(hash);
  if (!first_in_sequence) event.parent_hash = parent_hash;
  event.token_ids.assign(tokens.begin(), tokens.end());
  events_.push_back(std::move(event));
}

void BlockManager::EmitRemoved(uint64_t hash) {
  if (!ReserveEventSpace()) return;
  if (!events_.empty() && events_.back().kind == KvCacheEvent::Kind::kRemoved) {
    events_.back().block_hashes.push_back(hash);
    return;
  }
  KvCacheEvent event;
  event.kind = KvCacheEvent::Kind::kRemoved;
  event.block_hashes.push_back(hash);
  events_.push_back(std::move(event));
}

std::vector<KvCacheEvent> BlockManager::TakeEvents() {
  pending_event_hashes_ = 0;
  return std::exchange(events_, {});
}

// ---------------------------------------------------------------------------
// Sequences.

bool BlockManager::CanAllocate(const PrefixMatch& match, int num_tokens, int reserve_blocks) const {
  const int needed = NumBlocksFor(num_tokens) - static_cast<int>(match.blocks.size());
  const int available = num_free_blocks() - match.num_unreferenced;
  return needed <= available - reserve_blocks;
}

int BlockManager::MaxAllocatableTokens(const PrefixMatch& match, int reserve_blocks) const {
  const int available = num_free_blocks() - match.num_unreferenced - reserve_blocks;
  return (static_cast<int>(match.blocks.size()) + std::max(0, available)) * options_.block_size;
}

absl::Status BlockManager::Allocate(SequenceId id, const PrefixMatch& match, int num_tokens) {
  if (seqs_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " already has blocks"));
  }
  if (match.version != version_ && !match.blocks.empty()) {
    return absl::FailedPreconditionError(
        "stale prefix match: the block manager changed since FindCachedPrefix");
  }
  if (num_tokens < match.num_tokens || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", num_tokens,
                                                   " slots over a prefix hit of ", match.num_tokens,
                                                   " tokens"));
  }
  if (!CanAllocate(match, num_tokens)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sequence ", id, " needs ", NumBlocksFor(num_tokens) - match.blocks.size(),
                     " new KV blocks; ", num_free_blocks() - match.num_unreferenced, " free"));
  }
  ++version_;
  SeqBlocks& seq = seqs_[id];
  seq.num_slots = num_tokens;
  seq.blocks.reserve(NumBlocksFor(num_tokens));
  // Reference the hit first: its blocks may sit in the evictable pool.
  for (BlockId b : match.blocks) {
    Ref(b);
    seq.blocks.push_back(b);
    seq.hashes.push_back(blocks_[b].hash);
    seq.serials.push_back(blocks_[b].serial);
  }
  while (static_cast<int>(seq.blocks.size()) < NumBlocksFor(num_tokens)) {
    BlockId b = TakeFreeBlock();
    Ref(b);
    seq.blocks.push_back(b);
  }
  if (options_.enable_prefix_caching) {
    counters_.prefix_query_tokens += match.num_query_tokens;
    counters_.prefix_hit_tokens += match.num_tokens;
    counters_.prefix_query_blocks += match.num_query_blocks;
    counters_.prefix_hit_blocks += static_cast<int64_t>(match.blocks.size());
  }
  return absl::OkStatus();
}

bool BlockManager::CanAppendSlots(SequenceId id, int n) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || n < 0) return false;
  const SeqBlocks& seq = it->second;
  const int needed = NumBlocksFor(seq.num_slots + n) - static_cast<int>(seq.blocks.size());
  return needed <= num_free_blocks();
}

int BlockManager::MaxAppendableSlots(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return 0;
  const SeqBlocks& seq = it->second;
  const int capacity =
      (static_cast<int>(seq.blocks.size()) + num_free_blocks()) * options_.block_size;
  return capacity - seq.num_slots;
}

absl::Status BlockManager::AppendSlots(SequenceId id, int n) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  if (n < 0) return absl::InvalidArgumentError("cannot append a negative number of slots");
  if (!CanAppendSlots(id, n)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sequence ", id, ": no free KV block for ", n, " more slots"));
  }
  ++version_;
  SeqBlocks& seq = it->second;
  seq.num_slots += n;
  while (static_cast<int>(seq.blocks.size()) < NumBlocksFor(seq.num_slots)) {
    BlockId b = TakeFreeBlock();
    Ref(b);
    seq.blocks.push_back(b);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<BlockCopy>> BlockManager::Truncate(SequenceId id, int k) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  SeqBlocks& seq = it->second;
  if (k < 0 || k > seq.num_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot drop ", k, " of the ", seq.num_slots, " slots of sequence ", id));
  }
  const int bs = options_.block_size;
  const int new_slots = seq.num_slots - k;
  const int keep_blocks = NumBlocksFor(new_slots);
  const int tail_tokens = new_slots % bs;
  const bool needs_copy = tail_tokens != 0 && blocks_[seq.blocks[keep_blocks - 1]].ref_count > 1;
  if (needs_copy) {
    // Blocks released below become free unless another sequence holds them.
    int will_free = 0;
    for (size_t i = keep_blocks; i < seq.blocks.size(); ++i) {
      if (blocks_[seq.blocks[i]].ref_count == 1) ++will_free;
    }
    if (num_free_blocks() + will_free == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("sequence ", id, ": no free KV block to copy a shared block into"));
    }
  }
  ++version_;
  while (static_cast<int>(seq.blocks.size()) > keep_blocks) {
    Unref(seq.blocks.back());
    seq.blocks.pop_back();
  }
  const size_t keep_hashes = std::min(seq.hashes.size(), static_cast<size_t>(new_slots / bs));
  seq.hashes.resize(keep_hashes);
  seq.serials.resize(keep_hashes);
  seq.num_slots = new_slots;
  std::optional<BlockCopy> copy;
  if (tail_tokens != 0) {
    // The tail block's free slots will be written again: it must be private
    // and out of the cache.
    const BlockId b = seq.blocks.back();
    if (needs_copy) {
      const BlockId fresh = TakeFreeBlock();
      Ref(fresh);
      Unref(b);
      seq.blocks.back() = fresh;
      copy = BlockCopy{b, fresh, tail_tokens};
    } else if (blocks_[b].cached) {
      Unregister(b);
    }
  }
  return copy;
}

bool BlockManager::Free(SequenceId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  ++version_;
  // Last block first: the LRU then evicts a chain from its tail.
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) Unref(*b);
  seqs_.erase(it);
  return true;
}

absl::Span<const BlockId> BlockManager::BlockTable(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

int BlockManager::NumSlots(SequenceId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.num_slots;
}

void BlockManager::SlotMapping(SequenceId id, int start, int count,
                               std::vector<int64_t>* slots) const {
  absl::Span<const BlockId> table = BlockTable(id);
  for (int p = start; p < start + count; ++p) {
    slots->push_back(SlotOf(table, options_.block_size, p));
  }
}

// ---------------------------------------------------------------------------
// Invariants.

absl::Status BlockManager::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  const int n = num_total_blocks();
  std::vector<int> refs(n, 0);
  for (const auto& [id, seq] : seqs_) {
    if (static_cast<int>(seq.blocks.size()) != NumBlocksFor(seq.num_slots)) {
      return fail("sequence ", id, " has ", seq.blocks.size(), " blocks for ", seq.num_slots,
                  " slots");
    }
    if (seq.hashes.size() != seq.serials.size() ||
        static_cast<int>(seq.hashes.size()) > seq.num_slots / options_.block_size) {
      return fail("sequence ", id, " has ", seq.hashes.size(), " hashed blocks for ", seq.num_slots,
                  " slots");
    }
    absl::flat_hash_set<BlockId> seen;
    for (size_t i = 0; i < seq.blocks.size(); ++i) {
      const BlockId b = seq.blocks[i];
      if (b < 0 || b >= n) return fail("sequence ", id, " holds invalid block ", b);
      if (!seen.insert(b).second) return fail("sequence ", id, " holds block ", b, " twice");
      ++refs[b];
      if (i < seq.hashes.size() && blocks_[b].cached &&
          (blocks_[b].hash != seq.hashes[i] || blocks_[b].serial != seq.serials[i])) {
        return fail("sequence ", id, " block ", b, " disagrees with its cache entry");
      }
      if (i >= seq.hashes.size() && blocks_[b].cached) {
        return fail("sequence ", id, " block ", b, " is cached beyond the computed blocks");
      }
    }
  }
  int cached = 0;
  for (BlockId b = 0; b < n; ++b) {
    const Block& block = blocks_[b];
    if (block.ref_count != refs[b]) {
      return fail("block ", b, " has ref_count ", block.ref_count, " but ", refs[b],
                  " table entries");
    }
    if (block.ref_count > 1 && !block.cached) {
      return fail("block ", b, " is shared by ", block.ref_count, " sequences but not cached");
    }
    if (block.in_lru != (block.ref_count == 0 && block.cached)) {
      return fail("block ", b, " LRU membership is wrong");
    }
    if (block.cached) {
      ++cached;
      auto it = cache_.find(block.hash);
      if (it == cache_.end() ||
          std::find(it->second.begin(), it->second.end(), b) == it->second.end()) {
        return fail("cached block ", b, " is missing from the index");
      }
      if (static_cast<int>(block.tokens.size()) != options_.block_size || block.serial == 0) {
        return fail("cached block ", b, " has no content record");
      }
    }
  }
  if (cached != num_cached_) return fail("num_cached_ ", num_cached_, " != ", cached);
  size_t indexed = 0;
  for (const auto& [hash, entries] : cache_) {
    if (entries.empty()) return fail("empty index entry");
    for (BlockId b : entries) {
      if (!blocks_[b].cached || blocks_[b].hash != hash) return fail("stale index entry ", b);
    }
    indexed += entries.size();
  }
  if (static_cast<int>(indexed) != num_cached_) return fail("index holds ", indexed, " entries");
  int lru = 0;
  BlockId prev = -1;
  for (BlockId b = lru_head_; b >= 0; b = blocks_[b].lru_next) {
    if (blocks_[b].lru_prev != prev) return fail("LRU links broken at block ", b);
    if (++lru > n) return fail("LRU list has a cycle");
    prev = b;
  }
  if (prev != lru_tail_) return fail("LRU tail is wrong");
  if (lru != num_evictable_) return fail("LRU length ", lru, " != ", num_evictable_);
  absl::flat_hash_set<BlockId> free_set;
  for (BlockId b : free_uncached_) {
    if (blocks_[b].ref_count != 0 || blocks_[b].cached) return fail("free block ", b, " in use");
    if (!free_set.insert(b).second) return fail("block ", b, " is free twice");
  }
  int used = 0;
  for (BlockId b = 0; b < n; ++b) used += blocks_[b].ref_count > 0 ? 1 : 0;
  if (used + num_evictable_ + num_free_uncached() != n) {
    return fail("used ", used, " + evictable ", num_evictable_, " + free ", num_free_uncached(),
                " != total ", n);
  }
  return absl::OkStatus();
}

}  // namespace tessera::engine
