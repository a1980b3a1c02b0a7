#include "router/u64_map.h"

#include <random>
#include <unordered_map>
#include <vector>

#include "gtest/gtest.h"

namespace tessera::router {
namespace {

TEST(U64MapTest, InsertFindEraseIncludingKeyZero) {
  U64Map<int> m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Find(5), nullptr);
  EXPECT_FALSE(m.Erase(5));
  bool inserted = false;
  m.FindOrInsert(5, &inserted) = 50;
  EXPECT_TRUE(inserted);
  m.FindOrInsert(0, &inserted) = 7;
  EXPECT_TRUE(inserted);
  m.FindOrInsert(5, &inserted) += 1;
  EXPECT_FALSE(inserted);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(*m.Find(5), 51);
  EXPECT_EQ(*m.Find(0), 7);
  std::vector<uint64_t> keys;
  m.Keys(10, &keys);
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_TRUE(m.Erase(0));
  EXPECT_FALSE(m.Contains(0));
  EXPECT_TRUE(m.Erase(5));
  EXPECT_TRUE(m.empty());
}

// Random operations against std::unordered_map, over a small key range so
// that clusters form, grow and are punched full of holes by erases.
TEST(U64MapTest, AgreesWithStdUnorderedMapUnderChurn) {
  std::mt19937_64 rng(17);
  U64Map<uint64_t> m;
  std::unordered_map<uint64_t, uint64_t> ref;
  for (int step = 0; step < 400000; ++step) {
    const uint64_t key = rng() % 3000;
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      bool inserted = false;
      uint64_t& v = m.FindOrInsert(key, &inserted);
      ASSERT_EQ(inserted, ref.count(key) == 0);
      v = step;
      ref[key] = step;
    } else if (op == 1) {
      ASSERT_EQ(m.Erase(key), ref.erase(key) == 1);
    } else {
      const uint64_t* v = m.Find(key);
      auto it = ref.find(key);
      ASSERT_EQ(v != nullptr, it != ref.end());
      if (v != nullptr) {
        ASSERT_EQ(*v, it->second);
      }
    }
    ASSERT_EQ(m.size(), ref.size());
  }
  for (const auto& [k, v] : ref) ASSERT_EQ(*m.Find(k), v);
}

// At a steady size the table never grows: erases leave no tombstones.
TEST(U64MapTest, SteadyChurnDoesNotGrowTheTable) {
  std::mt19937_64 rng(3);
  U64Map<int> m;
  std::vector<uint64_t> live;
  for (int i = 0; i < 10000; ++i) {
    live.push_back(rng());
    m.FindOrInsert(live.back());
  }
  const size_t capacity = m.capacity();
  for (int i = 0; i < 200000; ++i) {
    const size_t victim = rng() % live.size();
    ASSERT_TRUE(m.Erase(live[victim]));
    live[victim] = rng();
    m.FindOrInsert(live[victim]);
  }
  EXPECT_EQ(m.capacity(), capacity);
  EXPECT_EQ(m.size(), live.size());
  for (uint64_t k : live) ASSERT_TRUE(m.Contains(k));
}

}  // namespace
}  // namespace tessera::router
