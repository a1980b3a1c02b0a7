// BlockManager: bookkeeping of a paged KV cache — a pool of fixed-size
// blocks, each sequence's block table, reference counts, and a prefix cache
// that lets a new sequence reuse the KV of blocks another sequence already
// computed. It never touches KV memory: the model runner writes KV to the
// slots (slot = block_id * block_size + offset) this class hands out.
//
// Prefix caching. A block that is full and whose KV has been computed is
// registered under its chained content hash (block_hash.h) when the caller
// reports the progress with CacheComputedBlocks(). A new sequence looks up
// its tokens block by block from the start (FindCachedPrefix) and stops at
// the first miss; the hit blocks are shared (reference counted), never
// copied. The lookup is capped so that at least the last known token is
// computed again: its logits are needed to sample, so a fully cached prompt
// still recomputes its last block.
//
// Collisions. A 64-bit hash is not trusted on its own. Every cached block
// keeps its token ids and the identity of its parent: a serial number given
// to each cache entry and never reused. A lookup accepts a candidate only if
// its tokens equal the request's and its parent serial is the serial of the
// block matched just before (0 for the first block). By induction a hit's
// whole prefix is verified token for token, so a collision (or an entry
// whose parent was evicted and re-cached elsewhere) is a miss, never wrong
// KV. Two entries may therefore share a hash; events report each one.
//
// Eviction. Blocks with no references are free. Free blocks that are not
// cached are used first; when none is left, the least recently released
// cached block is evicted (it leaves the cache and a kRemoved event is
// queued). A sequence releases its blocks last-to-first, so the tail of a
// chain is evicted before its head.
//
// Events. kStored / kRemoved events with block hashes (and the parent hash
// and tokens of stored chains) queue up for a consumer such as the router's
// prefix index, which drains them with TakeEvents().
//
// Thread-safety: not thread-safe. The engine loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/block_hash.h"
#include "worker/engine/sequence.h"

namespace tessera::engine {

using BlockId = int32_t;

struct BlockManagerOptions {
  int block_size = 16;  // tokens per block; REQUIRES: > 0
  int num_blocks = 0;   // REQUIRES: > 0
  bool enable_prefix_caching = true;
  // Mixed into every block hash (block_hash.h); caches with different seeds
  // never share hashes.
  uint64_t hash_seed = 0;
  // Block hashes held in undrained events; beyond it new events are dropped
  // and counted (the consumer must then resynchronize). 0 disables events.
  int64_t max_pending_event_hashes = int64_t{1} << 20;
  // Tests only: replaces HashBlockTokens (e.g. by a constant, to force
  // collisions).
  std::function<uint64_t(uint64_t parent_hash, absl::Span<const TokenId> tokens)> hash_for_testing;
};

struct KvCacheEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  // kStored: a chain, each block the parent of the next.
  // kRemoved: evicted blocks, in eviction order.
  std::vector<uint64_t> block_hashes;
  // kStored: hash of the first block's parent; nullopt when the chain starts
  // a sequence.
  std::optional<uint64_t> parent_hash;
  // kStored: the blocks' token ids, block_size per hash.
  std::vector<TokenId> token_ids;
};

// The result of FindCachedPrefix, valid until the next mutation of the
// manager (Allocate refuses a stale one).
struct PrefixMatch {
  std::vector<BlockId> blocks;  // the hit, in order
  int num_tokens = 0;           // blocks.size() * block_size
  int num_unreferenced = 0;     // hit blocks now in the free (evictable) pool
  // Lookup size, for the hit-rate counters: tokens given, and full blocks
  // eligible for a hit.
  int num_query_tokens = 0;
  int num_query_blocks = 0;
  uint64_t version = 0;
};

// Copy of the first num_tokens KV slots of block src into block dst, which
// the caller (model runner) must perform before writing into dst.
struct BlockCopy {
  BlockId src = -1;
  BlockId dst = -1;
  int num_tokens = 0;
};

struct BlockManagerStats {
  int num_total_blocks = 0;
  int num_free_blocks = 0;       // not referenced; includes evictable ones
  int num_used_blocks = 0;       // referenced by at least one sequence
  int num_cached_blocks = 0;     // registered in the prefix cache (used or not)
  int num_evictable_blocks = 0;  // cached and not referenced
  // Prefix-cache lookups made by Allocate.
  int64_t prefix_query_blocks = 0;
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_evictions = 0;
  int64_t num_events_dropped = 0;
};

class BlockManager {
 public:
  static absl::StatusOr<std::unique_ptr<BlockManager>> Create(const BlockManagerOptions& options);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  const BlockManagerOptions& options() const { return options_; }
  int block_size() const { return options_.block_size; }
  int num_total_blocks() const { return options_.num_blocks; }
  int num_free_blocks() const { return num_free_uncached() + num_evictable_; }
  int num_evictable_blocks() const { return num_evictable_; }
  int num_used_blocks() const { return num_total_blocks() - num_free_blocks(); }
  int num_cached_blocks() const { return num_cached_; }
  BlockManagerStats stats() const;

  // Blocks needed to hold num_tokens tokens.
  int NumBlocksFor(int num_tokens) const {
    return (num_tokens + options_.block_size - 1) / options_.block_size;
  }
  // The KV slot of `position` in a sequence with this block table.
  // REQUIRES: position / block_size < table.size().
  static int64_t SlotOf(absl::Span<const BlockId> table, int block_size, int position) {
    return int64_t{table[position / block_size]} * block_size + position % block_size;
  }

  // --- Prefix cache ---

  // The longest cached prefix of `tokens` in whole blocks, leaving at least
  // the last token uncovered. Empty when prefix caching is off. No effect on
  // the cache or its counters.
  PrefixMatch FindCachedPrefix(absl::Span<const TokenId> tokens) const;

  // Registers the blocks of `id` that are full within its first
  // num_computed_tokens tokens (`tokens` are the sequence's tokens, at least
  // that many) and not yet registered, queuing kStored events. A block whose
  // content is already cached under another block stays private.
  // REQUIRES: the same tokens on every call for one sequence (a prefix may
  // grow), num_computed_tokens <= NumSlots(id).
  absl::Status CacheComputedBlocks(SequenceId id, absl::Span<const TokenId> tokens,
                                   int num_computed_tokens);

  // Evicts every cached block that no sequence uses. Returns how many.
  int ResetPrefixCache();

  // Drains the queued events, oldest first.
  std::vector<KvCacheEvent> TakeEvents();

  // --- Sequences ---

  // Whether Allocate(id, match, num_tokens) would succeed while leaving at
  // least reserve_blocks free blocks.
  bool CanAllocate(const PrefixMatch& match, int num_tokens, int reserve_blocks = 0) const;
  // The most tokens Allocate(.., match, n) can take while leaving
  // reserve_blocks free (at least match.num_tokens).
  int MaxAllocatableTokens(const PrefixMatch& match, int reserve_blocks = 0) const;
  // Starts sequence `id` with num_tokens KV slots: the match's blocks
  // (shared) followed by fresh ones. ALREADY_EXISTS for a known id,
  // FAILED_PRECONDITION for a stale match, RESOURCE_EXHAUSTED (nothing
  // changed) when the pool is short. An empty PrefixMatch{} starts without
  // reuse. REQUIRES: num_tokens >= match.num_tokens.
  absl::Status Allocate(SequenceId id, const PrefixMatch& match, int num_tokens);

  // Whether n more slots fit in the table of `id`.
  bool CanAppendSlots(SequenceId id, int n) const;
  // The most slots AppendSlots(id, n) can add now.
  int MaxAppendableSlots(SequenceId id) const;
  // Adds n slots at the end of `id` (a decode token, a prefill chunk),
  // taking new blocks when the last one fills. RESOURCE_EXHAUSTED (nothing
  // changed) when the pool is short.
  absl::Status AppendSlots(SequenceId id, int n);
  absl::Status AppendSlot(SequenceId id) { return AppendSlots(id, 1); }

  // Drops the last k slots of `id` (rollback of rejected speculative tokens).
  // Blocks no longer needed are released. When the new last block is partial
  // and cached, it leaves the cache; when it is shared with another
  // sequence, `id` gets a fresh block instead, and the returned copy must be
  // performed before the next KV write. REQUIRES: 0 <= k <= NumSlots(id).
  absl::StatusOr<std::optional<BlockCopy>> Truncate(SequenceId id, int k);

  // Releases every block of `id`. Cached ones stay cached (evictable).
  // Returns false for an unknown id.
  bool Free(SequenceId id);

  bool Contains(SequenceId id) const { return seqs_.contains(id); }
  // Empty for an unknown id.
  absl::Span<const BlockId> BlockTable(SequenceId id) const;
  // KV slots reserved for `id` (0 for an unknown id).
  int NumSlots(SequenceId id) const;
  // Appends the slots of positions [start, start + count) of `id` to *slots.
  // REQUIRES: start + count <= NumSlots(id).
  void SlotMapping(SequenceId id, int start, int count, std::vector<int64_t>* slots) const;

  // --- Introspection ---

  int RefCount(BlockId block) const { return blocks_[block].ref_count; }
  bool IsCached(BlockId block) const { return blocks_[block].cached; }
  // Verifies every internal invariant (reference counts equal table
  // occupancy, a block in two tables is cached, free/evictable/used
  // partition the pool, the cache index matches the blocks, ...).
  absl::Status CheckInvariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    // Meaningful while cached:
    uint64_t hash = 0;
    uint64_t serial = 0;
    uint64_t parent_serial = 0;
    std::vector<TokenId> tokens;
    // Intrusive LRU list of evictable blocks (cached, unreferenced).
    BlockId lru_prev = -1;
    BlockId lru_next = -1;
    bool in_lru = false;
  };
  struct SeqBlocks {
    std::vector<BlockId> blocks;
    int num_slots = 0;
    // Hash and content serial of the leading full, computed blocks.
    std::vector<uint64_t> hashes;
    std::vector<uint64_t> serials;
  };

  explicit BlockManager(const BlockManagerOptions& options);

  uint64_t HashBlock(uint64_t parent_hash, absl::Span<const TokenId> tokens) const;
  int num_free_uncached() const { return static_cast<int>(free_uncached_.size()); }
  // A cache entry with this content and parent, or -1.
  BlockId FindEntry(uint64_t hash, uint64_t parent_serial, absl::Span<const TokenId> tokens) const;
  // REQUIRES: num_free_blocks() > 0.
  BlockId TakeFreeBlock();
  void Ref(BlockId b);
  void Unref(BlockId b);
  void Register(BlockId b, uint64_t hash, uint64_t parent_hash, bool first_in_sequence,
                uint64_t parent_serial, absl::Span<const TokenId> tokens);
  void Unregister(BlockId b);
  void LruPushBack(BlockId b);
  void LruRemove(BlockId b);
  void EmitStored(uint64_t hash, uint64_t parent_hash, bool first_in_sequence,
                  absl::Span<const TokenId> tokens);
  void EmitRemoved(uint64_t hash);
  bool ReserveEventSpace();

  const BlockManagerOptions options_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_uncached_;  // a stack
  BlockId lru_head_ = -1;               // least recently released
  BlockId lru_tail_ = -1;
  int num_evictable_ = 0;
  int num_cached_ = 0;
  absl::flat_hash_map<uint64_t, absl::InlinedVector<BlockId, 1>> cache_;
  absl::flat_hash_map<SequenceId, SeqBlocks> seqs_;
  uint64_t next_serial_ = 1;
  uint64_t version_ = 1;
  std::vector<KvCacheEvent> events_;
  int64_t pending_event_hashes_ = 0;
  BlockManagerStats counters_;  // the cumulative fields
};

}  // namespace tessera::engine
