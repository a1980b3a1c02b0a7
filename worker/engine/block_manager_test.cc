#include "worker/engine/block_manager.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kBs = 4;

std::unique_ptr<BlockManager> Make(int num_blocks, bool prefix_caching = true,
                                   BlockManagerOptions extra = {}) {
  BlockManagerOptions o = std::move(extra);
  o.block_size = kBs;
  o.num_blocks = num_blocks;
  o.enable_prefix_caching = prefix_caching;
  auto bm = BlockManager::Create(o);
  EXPECT_TRUE(bm.ok()) << bm.status();
  return *std::move(bm);
}

// tokens first, first+1, ...
std::vector<TokenId> Range(int n, TokenId first) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Allocates `tokens` for `id` (with the cached prefix), marks them all
// computed and registers the full blocks. Returns the cached token count.
int AllocateAndCompute(BlockManager& bm, SequenceId id, const std::vector<TokenId>& tokens) {
  PrefixMatch m = bm.FindCachedPrefix(tokens);
  EXPECT_TRUE(bm.Allocate(id, m, static_cast<int>(tokens.size())).ok());
  EXPECT_TRUE(bm.CacheComputedBlocks(id, tokens, static_cast<int>(tokens.size())).ok());
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  return m.num_tokens;
}

std::vector<BlockId> Table(const BlockManager& bm, SequenceId id) {
  auto t = bm.BlockTable(id);
  return {t.begin(), t.end()};
}

TEST(BlockManagerTest, RejectsBadOptions) {
  BlockManagerOptions o;
  o.num_blocks = 0;
  EXPECT_EQ(BlockManager::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.num_blocks = 4;
  o.block_size = 0;
  EXPECT_EQ(BlockManager::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockManagerTest, AllocateAppendFreeCountsAndSlots) {
  auto bm = Make(8);
  ASSERT_TRUE(bm->Allocate(1, PrefixMatch{}, 6).ok());  // 2 blocks
  EXPECT_EQ(bm->num_used_blocks(), 2);
  EXPECT_EQ(bm->num_free_blocks(), 6);
  EXPECT_EQ(bm->NumSlots(1), 6);
  const std::vector<BlockId> table = Table(*bm, 1);
  ASSERT_EQ(table.size(), 2u);
  for (BlockId b : table) EXPECT_EQ(bm->RefCount(b), 1);

  std::vector<int64_t> slots;
  bm->SlotMapping(1, 0, 6, &slots);
  for (int p = 0; p < 6; ++p) EXPECT_EQ(slots[p], table[p / kBs] * kBs + p % kBs);

  // Two more slots fill block 2; the next one needs a third block.
  ASSERT_TRUE(bm->AppendSlot(1).ok());
  ASSERT_TRUE(bm->AppendSlot(1).ok());
  EXPECT_EQ(bm->num_used_blocks(), 2);
  ASSERT_TRUE(bm->AppendSlot(1).ok());
  EXPECT_EQ(bm->num_used_blocks(), 3);
  EXPECT_EQ(bm->NumSlots(1), 9);
  EXPECT_TRUE(bm->CheckInvariants().ok());

  EXPECT_TRUE(bm->Free(1));
  EXPECT_FALSE(bm->Free(1));
  EXPECT_EQ(bm->num_free_blocks(), 8);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, ShortPoolChangesNothing) {
  auto bm = Make(3);
  ASSERT_TRUE(bm->Allocate(1, PrefixMatch{}, 8).ok());
  EXPECT_FALSE(bm->CanAllocate(PrefixMatch{}, 5));
  absl::Status s = bm->Allocate(2, PrefixMatch{}, 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(bm->Contains(2));
  EXPECT_EQ(bm->MaxAppendableSlots(1), 4);
  EXPECT_EQ(bm->AppendSlots(1, 5).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm->NumSlots(1), 8);
  EXPECT_EQ(bm->num_used_blocks(), 2);
  EXPECT_EQ(bm->Allocate(1, PrefixMatch{}, 1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, SharedPrefixIsReusedWithReferenceCounts) {
  auto bm = Make(16);
  const std::vector<TokenId> prefix = Range(8, 100);  // 2 full blocks
  const auto a = Concat(prefix, {1, 2, 3});
  const auto b = Concat(prefix, {7, 8});
  EXPECT_EQ(AllocateAndCompute(*bm, 1, a), 0);
  EXPECT_EQ(AllocateAndCompute(*bm, 2, b), 8);
  const auto ta = Table(*bm, 1), tb = Table(*bm, 2);
  EXPECT_EQ(ta[0], tb[0]);
  EXPECT_EQ(ta[1], tb[1]);
  EXPECT_NE(ta[2], tb[2]);
  EXPECT_EQ(bm->RefCount(ta[0]), 2);
  EXPECT_EQ(bm->RefCount(ta[2]), 1);
  EXPECT_TRUE(bm->IsCached(ta[0]));
  EXPECT_FALSE(bm->IsCached(ta[2]));  // partial
  EXPECT_EQ(bm->num_used_blocks(), 4);

  const BlockManagerStats st = bm->stats();
  EXPECT_EQ(st.prefix_hit_blocks, 2);
  EXPECT_EQ(st.prefix_hit_tokens, 8);
  EXPECT_EQ(st.prefix_query_tokens, static_cast<int64_t>(a.size() + b.size()));
  EXPECT_EQ(st.prefix_query_blocks, 2 + 2);

  bm->Free(1);
  EXPECT_EQ(bm->RefCount(ta[0]), 1);
  EXPECT_EQ(bm->num_used_blocks(), 3);
  bm->Free(2);
  // Both full prefix blocks stay cached and evictable.
  EXPECT_EQ(bm->num_free_blocks(), 16);
  EXPECT_EQ(bm->num_evictable_blocks(), 2);
  EXPECT_EQ(bm->num_cached_blocks(), 2);
  EXPECT_TRUE(bm->CheckInvariants().ok());

  // A third sequence reuses the evictable blocks: they leave the free pool.
  const auto c = Concat(prefix, {9});
  PrefixMatch m = bm->FindCachedPrefix(c);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.num_unreferenced, 2);
  ASSERT_TRUE(bm->Allocate(3, m, 9).ok());
  EXPECT_EQ(bm->num_evictable_blocks(), 0);
  EXPECT_EQ(bm->num_used_blocks(), 3);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, DifferentParentMeansNoHit) {
  auto bm = Make(16);
  const auto second = Range(4, 50);
  AllocateAndCompute(*bm, 1, Concat(Range(4, 0), Concat(second, {1})));
  // Same second block after a different first block: nothing to reuse.
  EXPECT_EQ(bm->FindCachedPrefix(Concat(Range(4, 10), Concat(second, {1}))).num_tokens, 0);
  // Same first block: hit both.
  EXPECT_EQ(bm->FindCachedPrefix(Concat(Range(4, 0), Concat(second, {1}))).num_tokens, 8);
}

TEST(BlockManagerTest, FullyCachedPromptRecomputesItsLastBlock) {
  auto bm = Make(16);
  const auto p = Range(12, 0);  // exactly 3 blocks
  AllocateAndCompute(*bm, 1, p);
  PrefixMatch m = bm->FindCachedPrefix(p);
  EXPECT_EQ(m.num_tokens, 8);  // the last token must produce logits
  EXPECT_EQ(m.num_query_blocks, 2);
  EXPECT_EQ(bm->FindCachedPrefix(Concat(p, {5})).num_tokens, 12);
}

TEST(BlockManagerTest, EventsDescribeStoredChainsAndEvictions) {
  auto bm = Make(3);
  const auto p = Range(9, 0);  // 2 full blocks + 1
  ASSERT_TRUE(bm->Allocate(1, PrefixMatch{}, 9).ok());
  // Computed in two steps: the second one continues the chain.
  ASSERT_TRUE(bm->CacheComputedBlocks(1, p, 5).ok());
  ASSERT_TRUE(bm->CacheComputedBlocks(1, p, 9).ok());
  std::vector<uint64_t> expected;
  HashFullBlocks(p, kBs, 0, &expected);
  std::vector<KvCacheEvent> events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);  // consecutive stores of one chain merge
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kStored);
  EXPECT_FALSE(events[0].parent_hash.has_value());
  EXPECT_THAT(events[0].block_hashes, ElementsAreArray(expected));
  EXPECT_THAT(events[0].token_ids, ElementsAreArray(Range(8, 0)));
  EXPECT_TRUE(bm->TakeEvents().empty());

  // Free, then demand all 3 blocks: both cached ones are evicted, tail first.
  bm->Free(1);
  ASSERT_TRUE(bm->Allocate(2, PrefixMatch{}, 12).ok());
  events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_THAT(events[0].block_hashes, ElementsAre(expected[1], expected[0]));
  EXPECT_EQ(bm->stats().num_evictions, 2);
  EXPECT_EQ(bm->num_cached_blocks(), 0);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, StoredEventOfAContinuationNamesItsParent) {
  auto bm = Make(8);
  const auto p = Range(8, 0);
  AllocateAndCompute(*bm, 1, Concat(p, {1}));
  bm->TakeEvents();
  // A new sequence extends the cached chain with a block of its own.
  AllocateAndCompute(*bm, 2, Concat(p, Range(5, 40)));
  std::vector<uint64_t> hashes;
  HashFullBlocks(Concat(p, Range(5, 40)), kBs, 0, &hashes);
  const auto events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].parent_hash.has_value());
  EXPECT_EQ(*events[0].parent_hash, hashes[1]);
  EXPECT_THAT(events[0].block_hashes, ElementsAre(hashes[2]));
}

TEST(BlockManagerTest, EvictsLeastRecentlyReleasedFirst) {
  auto bm = Make(4);
  const auto a = Range(4, 0), b = Range(4, 10), c = Range(4, 20);
  std::vector<uint64_t> ha, hb, hc;
  HashFullBlocks(a, kBs, 0, &ha);
  HashFullBlocks(b, kBs, 0, &hb);
  HashFullBlocks(c, kBs, 0, &hc);
  // Each sequence: one full (cached) block plus one token.
  AllocateAndCompute(*bm, 1, Concat(a, {0}));
  AllocateAndCompute(*bm, 2, Concat(b, {0}));
  bm->Free(1);
  bm->Free(2);
  AllocateAndCompute(*bm, 3, Concat(c, {0}));  // takes the 2 uncached free blocks
  bm->Free(3);
  bm->TakeEvents();
  EXPECT_EQ(bm->num_evictable_blocks(), 3);

  // Touch a: hit and release again, so it becomes the most recent.
  AllocateAndCompute(*bm, 4, Concat(a, {1}));
  bm->Free(4);
  bm->TakeEvents();

  // Two fresh blocks: the free one, then the LRU one (b), then c.
  ASSERT_TRUE(bm->Allocate(5, PrefixMatch{}, 8).ok());
  ASSERT_TRUE(bm->AppendSlots(5, 4).ok());
  const auto events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].block_hashes, ElementsAre(hb[0], hc[0]));
  EXPECT_EQ(bm->FindCachedPrefix(Concat(a, {1})).num_tokens, 4);  // a survived
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, DuplicateContentStaysPrivateButChainsContinue) {
  auto bm = Make(16);
  const auto p = Range(8, 0);
  // Two sequences compute the same prefix at once (neither hits).
  ASSERT_TRUE(bm->Allocate(1, bm->FindCachedPrefix(Concat(p, {1})), 9).ok());
  ASSERT_TRUE(bm->Allocate(2, bm->FindCachedPrefix(Concat(p, {1})), 12).ok());
  const auto two = Concat(p, Range(4, 60));
  ASSERT_TRUE(bm->CacheComputedBlocks(1, Concat(p, {1}), 9).ok());
  ASSERT_TRUE(bm->CacheComputedBlocks(2, two, 12).ok());
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
  EXPECT_EQ(bm->num_cached_blocks(), 3);  // seq 2's copies of p are not registered
  EXPECT_FALSE(bm->IsCached(Table(*bm, 2)[0]));
  EXPECT_TRUE(bm->IsCached(Table(*bm, 2)[2]));
  // A third sequence follows the chain across both: blocks 0-1 of seq 1,
  // block 2 of seq 2.
  PrefixMatch m = bm->FindCachedPrefix(Concat(two, {3}));
  ASSERT_EQ(m.num_tokens, 12);
  EXPECT_EQ(m.blocks[0], Table(*bm, 1)[0]);
  EXPECT_EQ(m.blocks[2], Table(*bm, 2)[2]);
  bm->Free(2);
  EXPECT_EQ(bm->num_evictable_blocks(), 1);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

// With every block hashing to the same value, lookups must still only hit
// exact prefixes: tokens and parent identity are verified.
TEST(BlockManagerTest, HashCollisionsNeverGiveWrongBlocks) {
  BlockManagerOptions extra;
  extra.hash_for_testing = [](uint64_t, absl::Span<const TokenId>) { return uint64_t{42}; };
  auto bm = Make(16, true, std::move(extra));
  const auto x = Range(4, 0), w = Range(4, 10), y = Range(4, 20);
  AllocateAndCompute(*bm, 1, Concat(x, Concat(y, {1})));  // chain x -> y
  AllocateAndCompute(*bm, 2, Concat(w, {1}));             // w, same hash as x
  // [w][y]: w hits, but the cached y block's parent is x, not w.
  PrefixMatch m = bm->FindCachedPrefix(Concat(w, Concat(y, {1})));
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.blocks[0], Table(*bm, 2)[0]);
  // Different tokens under the same hash: miss.
  EXPECT_EQ(bm->FindCachedPrefix(Concat(Range(4, 30), {1})).num_tokens, 0);
  // The exact chain still hits.
  EXPECT_EQ(bm->FindCachedPrefix(Concat(x, Concat(y, {1}))).num_tokens, 8);
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
}

TEST(BlockManagerTest, TruncateReleasesBlocksAndUncachesThePartialTail) {
  auto bm = Make(8);
  const auto p = Range(10, 0);
  AllocateAndCompute(*bm, 1, p);  // blocks: [0..3] [4..7] [8,9]
  const auto table = Table(*bm, 1);
  bm->TakeEvents();
  // Drop 4 tokens: 6 remain; block 1 becomes partial and leaves the cache.
  auto copy = bm->Truncate(1, 4);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_FALSE(copy->has_value());
  EXPECT_EQ(bm->NumSlots(1), 6);
  EXPECT_THAT(Table(*bm, 1), ElementsAre(table[0], table[1]));
  EXPECT_TRUE(bm->IsCached(table[0]));
  EXPECT_FALSE(bm->IsCached(table[1]));
  EXPECT_EQ(bm->RefCount(table[2]), 0);
  std::vector<uint64_t> hashes;
  HashFullBlocks(p, kBs, 0, &hashes);
  const auto events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kRemoved);
  EXPECT_THAT(events[0].block_hashes, ElementsAre(hashes[1]));
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
  // Recomputing different tokens re-registers the block under new content.
  auto q = Concat(Range(6, 0), {77, 78, 79, 80, 81});
  ASSERT_TRUE(bm->AppendSlots(1, 5).ok());
  ASSERT_TRUE(bm->CacheComputedBlocks(1, q, 11).ok());
  EXPECT_EQ(bm->FindCachedPrefix(Concat(q, {1})).num_tokens, 8);
  EXPECT_EQ(bm->FindCachedPrefix(p).num_tokens, 4);
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
  EXPECT_EQ(bm->Truncate(1, 12).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockManagerTest, TruncateIntoASharedBlockCopiesIt) {
  auto bm = Make(8);
  const auto p = Range(8, 0);
  AllocateAndCompute(*bm, 1, Concat(p, {1}));
  AllocateAndCompute(*bm, 2, Concat(p, {2}));
  const BlockId shared = Table(*bm, 2)[1];
  ASSERT_EQ(bm->RefCount(shared), 2);
  // Seq 2 rolls back 3 tokens: 6 remain, cutting into the shared block 1.
  auto copy = bm->Truncate(2, 3);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->has_value());
  EXPECT_EQ((*copy)->src, shared);
  EXPECT_EQ((*copy)->num_tokens, 2);
  EXPECT_NE(Table(*bm, 2)[1], shared);
  EXPECT_EQ((*copy)->dst, Table(*bm, 2)[1]);
  EXPECT_EQ(bm->RefCount(shared), 1);
  EXPECT_TRUE(bm->IsCached(shared));  // seq 1's copy is untouched
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
}

TEST(BlockManagerTest, TruncateWithoutRoomForTheCopyFails) {
  auto bm = Make(4);
  const auto p = Range(8, 0);
  AllocateAndCompute(*bm, 1, Concat(p, {1}));  // 3 blocks, the first 2 cached
  // Seq 2 holds only the 2 shared blocks; seq 3 takes the last free one.
  ASSERT_TRUE(bm->Allocate(2, bm->FindCachedPrefix(Concat(p, {2})), 8).ok());
  ASSERT_TRUE(bm->Allocate(3, PrefixMatch{}, 1).ok());
  ASSERT_EQ(bm->num_free_blocks(), 0);
  // Cutting seq 2 to 5 tokens lands inside shared block 1: no block for a copy.
  EXPECT_EQ(bm->Truncate(2, 3).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm->NumSlots(2), 8);
  EXPECT_EQ(bm->RefCount(Table(*bm, 2)[1]), 2);
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
  // Once a block is free, the copy goes through.
  bm->Free(3);
  auto copy = bm->Truncate(2, 3);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->has_value());
  EXPECT_EQ((*copy)->num_tokens, 1);
  EXPECT_TRUE(bm->CheckInvariants().ok()) << bm->CheckInvariants();
}

TEST(BlockManagerTest, StaleMatchIsRefused) {
  auto bm = Make(8);
  const auto p = Range(8, 0);
  AllocateAndCompute(*bm, 1, Concat(p, {1}));
  PrefixMatch m = bm->FindCachedPrefix(Concat(p, {2}));
  ASSERT_EQ(m.num_tokens, 8);
  bm->Free(1);
  EXPECT_EQ(bm->Allocate(2, m, 9).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BlockManagerTest, ResetPrefixCacheEvictsOnlyUnusedBlocks) {
  auto bm = Make(8);
  AllocateAndCompute(*bm, 1, Range(9, 0));
  AllocateAndCompute(*bm, 2, Range(5, 50));
  bm->Free(2);
  EXPECT_EQ(bm->num_cached_blocks(), 3);
  EXPECT_EQ(bm->ResetPrefixCache(), 1);
  EXPECT_EQ(bm->num_cached_blocks(), 2);
  EXPECT_EQ(bm->num_evictable_blocks(), 0);
  EXPECT_TRUE(bm->CheckInvariants().ok());
}

TEST(BlockManagerTest, PrefixCachingOffMeansNoHitsNoEvents) {
  auto bm = Make(8, /*prefix_caching=*/false);
  const auto p = Range(9, 0);
  EXPECT_EQ(AllocateAndCompute(*bm, 1, p), 0);
  EXPECT_EQ(AllocateAndCompute(*bm, 2, p), 0);
  EXPECT_EQ(bm->num_cached_blocks(), 0);
  EXPECT_TRUE(bm->TakeEvents().empty());
  EXPECT_EQ(bm->stats().prefix_query_tokens, 0);
}

TEST(BlockManagerTest, EventOverflowIsCounted) {
  BlockManagerOptions extra;
  extra.max_pending_event_hashes = 2;
  auto bm = Make(8, true, std::move(extra));
  AllocateAndCompute(*bm, 1, Range(13, 0));  // 3 full blocks
  const auto events = bm->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].block_hashes.size(), 2u);
  EXPECT_EQ(bm->stats().num_events_dropped, 1);
}

TEST(BlockManagerTest, InvalidCommitIsRejected) {
  auto bm = Make(8);
  ASSERT_TRUE(bm->Allocate(1, PrefixMatch{}, 4).ok());
  EXPECT_EQ(bm->CacheComputedBlocks(1, Range(8, 0), 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm->CacheComputedBlocks(9, Range(8, 0), 4).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(bm->CacheComputedBlocks(1, Range(2, 0), 4).message()),
              HasSubstr("2 tokens"));
}

}  // namespace
}  // namespace tessera::engine
