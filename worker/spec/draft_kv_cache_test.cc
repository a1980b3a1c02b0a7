#include "worker/spec/draft_kv_cache.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(DraftKvCacheTest, RefusesAnEmptyPool) {
  EXPECT_FALSE(DraftKvCache::Create(0, 4).ok());
  EXPECT_FALSE(DraftKvCache::Create(4, 0).ok());
}

TEST(DraftKvCacheTest, AppendTakesBlocksAsSlotsFill) {
  auto kv = *DraftKvCache::Create(4, 3);
  ASSERT_TRUE(kv->Append(7, 3));
  EXPECT_THAT(kv->BlockTable(7), ElementsAre(0));
  ASSERT_TRUE(kv->Append(7, 2));
  EXPECT_EQ(kv->NumSlots(7), 5);
  EXPECT_THAT(kv->BlockTable(7), ElementsAre(0, 1));
  EXPECT_EQ(kv->num_free_blocks(), 1);
}

TEST(DraftKvCacheTest, AShortPoolChangesNothing) {
  auto kv = *DraftKvCache::Create(4, 2);
  ASSERT_TRUE(kv->Append(1, 5));
  EXPECT_FALSE(kv->Append(1, 4));  // needs a third block
  EXPECT_EQ(kv->NumSlots(1), 5);
  EXPECT_FALSE(kv->Append(2, 1));  // a new sequence that does not fit is not started
  EXPECT_FALSE(kv->Contains(2));
  EXPECT_TRUE(kv->Append(1, 3));  // fills the second block exactly
}

TEST(DraftKvCacheTest, TruncateAndFreeReturnBlocks) {
  auto kv = *DraftKvCache::Create(2, 4);
  ASSERT_TRUE(kv->Append(1, 7));
  kv->Truncate(1, 3);
  EXPECT_EQ(kv->NumSlots(1), 3);
  EXPECT_THAT(kv->BlockTable(1), ElementsAre(0, 1));
  EXPECT_EQ(kv->num_free_blocks(), 2);
  kv->Truncate(1, 0);
  EXPECT_THAT(kv->BlockTable(1), IsEmpty());
  EXPECT_TRUE(kv->Contains(1));
  kv->Free(1);
  kv->Free(1);  // unknown now: ignored
  EXPECT_FALSE(kv->Contains(1));
  EXPECT_EQ(kv->num_free_blocks(), 4);
  ASSERT_TRUE(kv->Append(2, 8));  // the whole pool again
  EXPECT_THAT(kv->BlockTable(2), ElementsAre(0, 1, 2, 3));
}

}  // namespace
}  // namespace tessera::spec
