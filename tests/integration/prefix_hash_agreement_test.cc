#include "router/prefix_hash.h"

#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/block_manager.h"

namespace tessera::router {
namespace {

using ::testing::ElementsAreArray;

std::vector<TokenId> RandomTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(n);
  for (auto& x : t) x = static_cast<TokenId>(rng() % 150000);
  return t;
}

// The property the router relies on: for the same tokens, block size and
// seed, the router's hashes equal the ones a worker's block manager reports
// in its stored events.
TEST(PrefixHashTest, MatchesTheWorkersBlockManagerEvents) {
  for (int block_size : {4, 16, 32}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{12345}}) {
      engine::BlockManagerOptions o;
      o.block_size = block_size;
      o.num_blocks = 64;
      o.hash_seed = seed;
      auto bm = engine::BlockManager::Create(o);
      ASSERT_TRUE(bm.ok()) << bm.status();
      const std::vector<TokenId> prompt = RandomTokens(5 * block_size + 3, block_size + seed);
      ASSERT_TRUE((*bm)->Allocate(1, engine::PrefixMatch{}, prompt.size()).ok());
      ASSERT_TRUE((*bm)->CacheComputedBlocks(1, prompt, prompt.size()).ok());
      std::vector<engine::KvCacheEvent> events = (*bm)->TakeEvents();
      ASSERT_EQ(events.size(), 1u);

      std::vector<uint64_t> ours;
      const HashScheme scheme{block_size, seed};
      ComputeBlockHashes(prompt, scheme, &ours);
      EXPECT_EQ(ours.size(), 5u);  // the partial trailing block has no hash
      EXPECT_THAT(ours, ElementsAreArray(events[0].block_hashes));
      EXPECT_TRUE(VerifyStoredBlocks(scheme, 0, events[0].block_hashes, events[0].token_ids).ok());
    }
  }
}

TEST(PrefixHashTest, ContinuationEventsChainFromTheirParent) {
  engine::BlockManagerOptions o;
  o.block_size = 4;
  o.num_blocks = 32;
  auto bm = engine::BlockManager::Create(o);
  ASSERT_TRUE(bm.ok());
  const std::vector<TokenId> tokens = RandomTokens(24, 9);
  ASSERT_TRUE((*bm)->Allocate(1, engine::PrefixMatch{}, tokens.size()).ok());
  ASSERT_TRUE((*bm)->CacheComputedBlocks(1, tokens, 8).ok());
  (*bm)->TakeEvents();
  ASSERT_TRUE((*bm)->CacheComputedBlocks(1, tokens, 24).ok());
  std::vector<engine::KvCacheEvent> events = (*bm)->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].parent_hash.has_value());

  std::vector<uint64_t> ours;
  ComputeBlockHashes(tokens, HashScheme{4, 0}, &ours);
  ASSERT_EQ(ours.size(), 6u);
  EXPECT_EQ(*events[0].parent_hash, ours[1]);
  EXPECT_THAT(events[0].block_hashes, ElementsAreArray(ours.begin() + 2, ours.end()));
  EXPECT_TRUE(VerifyStoredBlocks(HashScheme{4, 0}, *events[0].parent_hash, events[0].block_hashes,
                                 events[0].token_ids)
                  .ok());
}

TEST(PrefixHashTest, SchemeChangesEveryHash) {
  const std::vector<TokenId> tokens = RandomTokens(64, 1);
  std::vector<uint64_t> a, b, c;
  ComputeBlockHashes(tokens, HashScheme{16, 0}, &a);
  ComputeBlockHashes(tokens, HashScheme{16, 1}, &b);
  ComputeBlockHashes(tokens, HashScheme{32, 0}, &c);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]);
  for (uint64_t h : c) EXPECT_THAT(a, ::testing::Not(::testing::Contains(h)));
}

TEST(PrefixHashTest, SharedPrefixSharesLeadingHashesOnly) {
  std::vector<TokenId> x = RandomTokens(64, 2);
  std::vector<TokenId> y = x;
  y[40] += 1;  // inside block 2
  std::vector<uint64_t> hx, hy;
  ComputeBlockHashes(x, HashScheme{16, 0}, &hx);
  ComputeBlockHashes(y, HashScheme{16, 0}, &hy);
  EXPECT_EQ(hx[0], hy[0]);
  EXPECT_EQ(hx[1], hy[1]);
  EXPECT_NE(hx[2], hy[2]);
  EXPECT_NE(hx[3], hy[3]);  // the chain carries the difference forward
}

TEST(PrefixHashTest, VerifyDetectsSeedBlockSizeAndParentMismatch) {
  const std::vector<TokenId> tokens = RandomTokens(32, 3);
  std::vector<uint64_t> hashes;
  ComputeBlockHashes(tokens, HashScheme{16, 5}, &hashes);
  EXPECT_TRUE(VerifyStoredBlocks(HashScheme{16, 5}, 0, hashes, tokens).ok());

  absl::Status wrong_seed = VerifyStoredBlocks(HashScheme{16, 6}, 0, hashes, tokens);
  EXPECT_EQ(wrong_seed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong_seed.message()), ::testing::HasSubstr("seed 6"));

  absl::Status wrong_size = VerifyStoredBlocks(HashScheme{8, 5}, 0, hashes, tokens);
  EXPECT_EQ(wrong_size.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(wrong_size.message()), ::testing::HasSubstr("block size 8"));

  EXPECT_EQ(VerifyStoredBlocks(HashScheme{16, 5}, 77, hashes, tokens).code(),
            absl::StatusCode::kFailedPrecondition);
  // Nothing to check without tokens.
  EXPECT_TRUE(VerifyStoredBlocks(HashScheme{16, 6}, 0, hashes, {}).ok());
}

}  // namespace
}  // namespace tessera::router
