#include "router/prefix_index.h"

#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

BlockEvent Stored(const std::vector<uint64_t>& hashes) {
  BlockEvent e;
  e.kind = BlockEvent::Kind::kStored;
  e.block_hashes = hashes;
  return e;
}

BlockEvent Removed(const std::vector<uint64_t>& hashes) {
  BlockEvent e;
  e.kind = BlockEvent::Kind::kRemoved;
  e.block_hashes = hashes;
  return e;
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  PrefixIndexOptions Options() {
    PrefixIndexOptions o;
    o.max_workers = 8;
    o.approx_max_blocks = 100;
    o.approx_ttl = absl::Seconds(60);
    o.pending_max_blocks = 50;
    o.pending_ttl = absl::Seconds(2);
    return o;
  }

  // Matched block counts of `hashes` for the given slots.
  std::vector<int32_t> MatchFor(PrefixIndex& index, const std::vector<uint64_t>& hashes,
                                const std::vector<int>& slots) {
    SlotSet among(index_capacity_);
    for (int s : slots) among.Set(s);
    std::vector<int32_t> matched;
    index.Match(hashes, among, &matched);
    std::vector<int32_t> out;
    for (int s : slots) out.push_back(matched[s]);
    return out;
  }

  int index_capacity_ = 8;
  FakeClock clock_;
  const std::vector<uint64_t> prompt_ = {11, 12, 13, 14, 15};
};

using ::testing::ElementsAre;

TEST_F(PrefixIndexTest, ExactEventsGiveLeadingBlockCounts) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  index.ResetSlot(1, 2);
  index.ResetSlot(2, 3);
  const std::vector<uint64_t> first3 = {11, 12, 13};
  const std::vector<uint64_t> all = prompt_;
  const std::vector<uint64_t> gap = {11, 13, 14};  // 12 missing
  std::vector<BlockEvent> e0 = {Stored(first3)};
  std::vector<BlockEvent> e1 = {Stored(all)};
  std::vector<BlockEvent> e2 = {Stored(gap)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, e0));
  ASSERT_TRUE(index.ApplyEvents(1, 2, true, e1));
  ASSERT_TRUE(index.ApplyEvents(2, 3, true, e2));
  EXPECT_THAT(MatchFor(index, prompt_, {0, 1, 2}), ElementsAre(3, 5, 1));

  const std::vector<uint64_t> evict = {15, 14};
  std::vector<BlockEvent> r1 = {Removed(evict)};
  ASSERT_TRUE(index.ApplyEvents(1, 2, false, r1));
  EXPECT_THAT(MatchFor(index, prompt_, {0, 1, 2}), ElementsAre(3, 3, 1));
  EXPECT_EQ(index.Stats(1).mode, IndexMode::kExact);
  EXPECT_EQ(index.Stats(1).exact_blocks, 3);
}

TEST_F(PrefixIndexTest, DuplicateHashesAreCountedPerCopy) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  const std::vector<uint64_t> h = {11};
  std::vector<BlockEvent> twice = {Stored(h), Stored(h)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, twice));
  std::vector<BlockEvent> once = {Removed(h)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, false, once));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(1));  // one copy left
  ASSERT_TRUE(index.ApplyEvents(0, 1, false, once));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
  // Removing what is not there is harmless.
  ASSERT_TRUE(index.ApplyEvents(0, 1, false, once));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
}

TEST_F(PrefixIndexTest, EventsBeforeASnapshotAreIgnored) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  const std::vector<uint64_t> h = {11, 12};
  std::vector<BlockEvent> e = {Stored(h)};
  EXPECT_FALSE(index.ApplyEvents(0, 1, false, e));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
  EXPECT_EQ(index.Stats(0).mode, IndexMode::kApproximate);
}

TEST_F(PrefixIndexTest, ResetReplacesTheWorkersBlocks) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  const std::vector<uint64_t> old_blocks = {11, 12, 13};
  const std::vector<uint64_t> new_blocks = {11};
  std::vector<BlockEvent> e1 = {Stored(old_blocks)};
  std::vector<BlockEvent> e2 = {Stored(new_blocks)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, e1));
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, e2));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(1));
  EXPECT_EQ(index.Stats(0).exact_blocks, 1);
}

TEST_F(PrefixIndexTest, StaleIncarnationsAreIgnored) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  std::vector<BlockEvent> e = {Stored(prompt_)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, e));
  index.ResetSlot(0, 2);  // the slot changes hands
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
  EXPECT_FALSE(index.ApplyEvents(0, 1, true, e));
  index.RecordRouted(0, 1, prompt_);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
  index.RecordRouted(0, 2, prompt_);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(5));
}

TEST_F(PrefixIndexTest, PredictionsExpireAfterTheirTtl) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  index.RecordRouted(0, 1, prompt_);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(5));
  clock_.Advance(absl::Seconds(59));
  index.RecordRouted(0, 1, std::vector<uint64_t>{11, 12});  // refreshes two blocks
  clock_.Advance(absl::Seconds(2));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(2));
  clock_.Advance(absl::Seconds(60));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
  EXPECT_EQ(index.Stats(0).predicted_blocks, 0);
}

TEST_F(PrefixIndexTest, PredictionCapacityEvictsDeepestBlocksFirst) {
  PrefixIndexOptions o = Options();
  o.approx_max_blocks = 4;
  PrefixIndex index(o, &clock_);
  index.ResetSlot(0, 1);
  index.RecordRouted(0, 1, prompt_);  // 5 blocks into 4 places
  EXPECT_EQ(index.Stats(0).predicted_blocks, 4);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(4));
  index.SetCapacity(0, 1, 2);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(2));
}

TEST_F(PrefixIndexTest, StoredEventConfirmsAPredictionSoItsRemovalCounts) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  std::vector<BlockEvent> none;
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, none));  // exact mode, empty cache
  index.RecordRouted(0, 1, prompt_);                 // pending predictions
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(5));
  EXPECT_EQ(index.Stats(0).predicted_blocks, 5);

  std::vector<BlockEvent> stored = {Stored(prompt_)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, false, stored));
  EXPECT_EQ(index.Stats(0).predicted_blocks, 0);
  const std::vector<uint64_t> tail = {14, 15};
  std::vector<BlockEvent> removed = {Removed(tail)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, false, removed));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(3));
}

TEST_F(PrefixIndexTest, PendingPredictionsOfExactWorkersExpireQuickly) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  std::vector<BlockEvent> none;
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, none));
  index.RecordRouted(0, 1, prompt_);
  clock_.Advance(absl::Seconds(3));  // pending_ttl is 2 s
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
}

TEST_F(PrefixIndexTest, EnteringExactModeDropsApproximatePredictions) {
  PrefixIndex index(Options(), &clock_);
  index.ResetSlot(0, 1);
  index.RecordRouted(0, 1, prompt_);
  const std::vector<uint64_t> one = {11};
  std::vector<BlockEvent> e = {Stored(one)};
  ASSERT_TRUE(index.ApplyEvents(0, 1, true, e));
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(1));
  index.FallBackToApproximate(0, 1);
  EXPECT_EQ(index.Stats(0).mode, IndexMode::kApproximate);
  EXPECT_THAT(MatchFor(index, prompt_, {0}), ElementsAre(0));
}

TEST_F(PrefixIndexTest, WorksAcrossSlotGroupsAndSmallChunks) {
  PrefixIndexOptions o = Options();
  o.max_workers = 130;  // three groups of 64
  o.apply_chunk = 3;
  index_capacity_ = 130;
  PrefixIndex index(o, &clock_);
  std::vector<uint64_t> long_prompt;
  for (uint64_t i = 0; i < 40; ++i) long_prompt.push_back(1000 + i);
  const std::vector<int> slots = {0, 63, 64, 100, 129};
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    index.ResetSlot(slots[i], 10 + i);
    std::vector<uint64_t> held(long_prompt.begin(), long_prompt.begin() + 8 * i);
    std::vector<BlockEvent> e = {Stored(held)};
    ASSERT_TRUE(index.ApplyEvents(slots[i], 10 + i, true, e));
  }
  EXPECT_THAT(MatchFor(index, long_prompt, slots), ElementsAre(0, 8, 16, 24, 32));
  // Only the queried slots are written.
  SlotSet among(130);
  among.Set(64);
  std::vector<int32_t> matched(130, -1);
  index.Match(long_prompt, among, &matched);
  EXPECT_EQ(matched[64], 16);
  EXPECT_EQ(matched[63], -1);
  // A chunked reset clears everything.
  index.ResetSlot(129, 99);
  EXPECT_THAT(MatchFor(index, long_prompt, {129}), ElementsAre(0));
  EXPECT_EQ(index.Stats(129).exact_blocks, 0);
}

// A brute-force model of one worker's view: exact copies per hash and a
// prediction set, checked against the index after random operations.
struct ReferenceWorker {
  bool exact = false;
  std::map<uint64_t, int> copies;
  std::set<uint64_t> predicted;
  bool Holds(uint64_t h) const { return copies.count(h) > 0 || predicted.count(h) > 0; }
};

TEST_F(PrefixIndexTest, AgreesWithABruteForceModelUnderRandomOperations) {
  PrefixIndexOptions o = Options();
  o.approx_max_blocks = 1 << 20;  // no capacity eviction in this model
  o.pending_max_blocks = 1 << 20;
  o.apply_chunk = 5;
  PrefixIndex index(o, &clock_);
  constexpr int kWorkers = 6;
  std::vector<ReferenceWorker> ref(kWorkers);
  for (int w = 0; w < kWorkers; ++w) index.ResetSlot(w, w + 1);
  std::mt19937 rng(42);
  auto random_chain = [&](int max_len) {
    // Hashes from a small alphabet so workers overlap.
    std::vector<uint64_t> h(1 + rng() % max_len);
    for (auto& x : h) x = 1 + rng() % 30;
    return h;
  };
  for (int step = 0; step < 3000; ++step) {
    const int w = rng() % kWorkers;
    const int op = rng() % 10;
    std::vector<uint64_t> h = random_chain(8);
    if (op < 3) {
      std::vector<BlockEvent> e = {Stored(h)};
      const bool reset = !ref[w].exact || rng() % 20 == 0;
      ASSERT_TRUE(index.ApplyEvents(w, w + 1, reset, e));
      if (reset) {
        if (!ref[w].exact) ref[w].predicted.clear();
        ref[w].copies.clear();
        ref[w].exact = true;
      }
      for (uint64_t x : h) {
        ++ref[w].copies[x];
        ref[w].predicted.erase(x);
      }
    } else if (op < 5) {
      if (!ref[w].exact) continue;
      std::vector<BlockEvent> e = {Removed(h)};
      ASSERT_TRUE(index.ApplyEvents(w, w + 1, false, e));
      for (uint64_t x : h) {
        auto it = ref[w].copies.find(x);
        if (it != ref[w].copies.end() && --it->second == 0) ref[w].copies.erase(it);
      }
    } else if (op < 8) {
      index.RecordRouted(w, w + 1, h);
      for (uint64_t x : h) {
        if (!(ref[w].exact && ref[w].copies.count(x))) ref[w].predicted.insert(x);
      }
    } else if (op < 9 && rng() % 10 == 0) {
      index.FallBackToApproximate(w, w + 1);
      ref[w].exact = false;
      ref[w].copies.clear();
    } else {
      // Query.
      std::vector<int> all;
      for (int i = 0; i < kWorkers; ++i) all.push_back(i);
      std::vector<int32_t> got = MatchFor(index, h, all);
      for (int i = 0; i < kWorkers; ++i) {
        int32_t want = 0;
        while (want < static_cast<int32_t>(h.size()) && ref[i].Holds(h[want])) ++want;
        ASSERT_EQ(got[i], want) << "worker " << i << " step " << step;
      }
    }
  }
}

// One feeder per worker plus query threads: queries see consistent answers
// (never more than the prompt) and the final state matches what was fed.
TEST_F(PrefixIndexTest, ConcurrentFeedersAndQueries) {
  PrefixIndexOptions o = Options();
  o.apply_chunk = 7;
  o.approx_max_blocks = 1 << 20;
  PrefixIndex index(o, SystemClock::Get());
  constexpr int kWorkers = 4;
  std::vector<uint64_t> chain;
  for (uint64_t i = 0; i < 64; ++i) chain.push_back(500 + i);
  for (int w = 0; w < kWorkers; ++w) index.ResetSlot(w, w + 1);

  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<BlockEvent> snapshot = {Stored(chain)};
      ASSERT_TRUE(index.ApplyEvents(w, w + 1, true, snapshot));
      const std::vector<uint64_t> tail(chain.begin() + 16 * w, chain.end());
      for (int round = 0; round < 200; ++round) {
        std::vector<BlockEvent> rm = {Removed(tail)};
        ASSERT_TRUE(index.ApplyEvents(w, w + 1, false, rm));
        std::vector<BlockEvent> add = {Stored(tail)};
        ASSERT_TRUE(index.ApplyEvents(w, w + 1, false, add));
      }
      std::vector<BlockEvent> rm = {Removed(tail)};
      ASSERT_TRUE(index.ApplyEvents(w, w + 1, false, rm));
    });
  }
  std::atomic<bool> stop{false};
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&] {
      SlotSet among(8);
      for (int w = 0; w < kWorkers; ++w) among.Set(w);
      std::vector<int32_t> matched;
      while (!stop.load()) {
        index.Match(chain, among, &matched);
        for (int w = 0; w < kWorkers; ++w) {
          ASSERT_GE(matched[w], 0);
          ASSERT_LE(matched[w], 64);
        }
      }
    });
  }
  for (int w = 0; w < kWorkers; ++w) threads[w].join();
  stop.store(true);
  for (size_t t = kWorkers; t < threads.size(); ++t) threads[t].join();
  std::vector<int> all = {0, 1, 2, 3};
  EXPECT_THAT(MatchFor(index, chain, all), ElementsAre(0, 16, 32, 48));
}

}  // namespace
}  // namespace tessera::router
