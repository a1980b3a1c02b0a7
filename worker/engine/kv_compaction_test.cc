#include "worker/engine/kv_compaction.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::engine {
namespace {

using ::testing::ElementsAre;

TEST(KvCompactionTest, ChainPrefixStaysInPlace) {
  const std::vector<int64_t> slots = {40, 41, 42, 43};
  EXPECT_TRUE(AcceptedPathCopies(slots, std::vector<int32_t>{}).empty());
  EXPECT_TRUE(AcceptedPathCopies(slots, std::vector<int32_t>{0, 1, 2}).empty());
}

TEST(KvCompactionTest, AcceptedNodesMoveNextToTheDecodeToken) {
  // Nodes live in slots that cross a block boundary (block size 4: blocks 10, 3).
  const std::vector<int64_t> slots = {42, 43, 12, 13, 14};
  // Accepted: node 1, then node 3 (a child of 1), then node 4.
  KvSlotCopies c = AcceptedPathCopies(slots, std::vector<int32_t>{1, 3, 4});
  EXPECT_THAT(c.from, ElementsAre(43, 13, 14));
  EXPECT_THAT(c.to, ElementsAre(42, 43, 12));
}

TEST(KvCompactionTest, OnlyMisplacedNodesMove) {
  const std::vector<int64_t> slots = {5, 6, 7, 8};
  KvSlotCopies c = AcceptedPathCopies(slots, std::vector<int32_t>{0, 2});
  EXPECT_THAT(c.from, ElementsAre(7));
  EXPECT_THAT(c.to, ElementsAre(6));
}

}  // namespace
}  // namespace tessera::engine
