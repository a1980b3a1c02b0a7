#include "router/policy.h"

#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

TEST(PolicyKindTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParsePolicyKind("cost"), PolicyKind::kCost);
  EXPECT_EQ(*ParsePolicyKind("cache_aware"), PolicyKind::kCost);
  EXPECT_EQ(*ParsePolicyKind("round_robin"), PolicyKind::kRoundRobin);
  EXPECT_EQ(*ParsePolicyKind("least_loaded"), PolicyKind::kLeastLoaded);
  absl::StatusOr<PolicyKind> bad = ParsePolicyKind("random");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("round_robin"));
  for (PolicyKind k : {PolicyKind::kCost, PolicyKind::kRoundRobin, PolicyKind::kLeastLoaded}) {
    EXPECT_EQ(*ParsePolicyKind(PolicyKindName(k)), k);
  }
}

TEST(CostTest, EachTermAddsItsWeightedAmount) {
  CostWeights w;
  w.prefill = 1.0;
  w.queued_prefill = 0.5;
  w.running = 10.0;
  w.waiting = 20.0;
  w.kv_pressure = 1000.0;
  w.kv_pressure_start = 0.8;
  Candidate c;
  c.cached_tokens = 32;
  c.queued_prefill_tokens = 200;
  c.running = 3;
  c.waiting = 2;
  c.kv_utilization = 0.5;  // below the start: no pressure
  const int64_t prompt = 100;
  EXPECT_DOUBLE_EQ(Cost(w, c, prompt), 1.0 * (100 - 32) + 0.5 * 200 + 10.0 * 3 + 20.0 * 2);
  EXPECT_DOUBLE_EQ(LoadCost(w, c), 0.5 * 200 + 10.0 * 3 + 20.0 * 2);

  c.kv_utilization = 0.9;  // halfway from 0.8 to 1.0
  EXPECT_NEAR(LoadCost(w, c) - (0.5 * 200 + 10.0 * 3 + 20.0 * 2), 0.5 * 1000.0, 1e-9);
  c.kv_utilization = 1.0;
  EXPECT_NEAR(LoadCost(w, c) - (0.5 * 200 + 10.0 * 3 + 20.0 * 2), 1000.0, 1e-9);

  // Cached beyond the prompt costs nothing, never less than nothing.
  c.kv_utilization = 0;
  c.cached_tokens = 500;
  EXPECT_DOUBLE_EQ(Cost(w, c, prompt), LoadCost(w, c));
}

TEST(CostTest, HighPriorityDiscountsOnlyTheQueueTerms) {
  CostWeights w;
  w.high_priority_queue_factor = 0.25;
  Candidate c;
  c.queued_prefill_tokens = 400;
  c.waiting = 4;
  c.running = 2;
  const double queue = w.queued_prefill * 400 + w.waiting * 4;
  const double running = w.running * 2;
  EXPECT_DOUBLE_EQ(LoadCost(w, c, Priority::kNormal), queue + running);
  EXPECT_DOUBLE_EQ(LoadCost(w, c, Priority::kHigh), 0.25 * queue + running);
  EXPECT_DOUBLE_EQ(LoadCost(w, c, Priority::kLow), queue + running);
}

std::vector<Candidate> Slots(int n) {
  std::vector<Candidate> c(n);
  for (int i = 0; i < n; ++i) c[i].slot = i;
  return c;
}

TEST(ChooseByCostTest, AClearlyCheapestCandidateAlwaysWins) {
  PolicyOptions o;
  SplitMix64 rng(1);
  std::vector<Candidate> c = Slots(5);
  const std::vector<double> costs = {900, 1200, 300, 5000, 800};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ChooseByCost(c, costs, o, &rng), 2u);
}

TEST(ChooseByCostTest, SpreadsOverTheNearBestOnly) {
  PolicyOptions o;
  o.near_best_relative = 0.05;
  o.near_best_absolute = 10;
  SplitMix64 rng(7);
  std::vector<Candidate> c = Slots(6);
  // Four within 5% of the best, two far off.
  const std::vector<double> costs = {1000, 1020, 1040, 1049, 2000, 1200};
  std::map<size_t, int> counts;
  constexpr int kTrials = 8000;
  for (int i = 0; i < kTrials; ++i) ++counts[ChooseByCost(c, costs, o, &rng)];
  EXPECT_EQ(counts.count(4), 0u);
  EXPECT_EQ(counts.count(5), 0u);
  // The power of two choices favours cheaper ones but uses all of them:
  // candidate k (by rank among 4) wins when sampled with a worse one,
  // P = (2 * (3 - k)) / 12 for a sampled pair, i.e. 1/2, 1/3, 1/6, 0.
  EXPECT_NEAR(counts[0] / double{kTrials}, 0.5, 0.03);
  EXPECT_NEAR(counts[1] / double{kTrials}, 1.0 / 3, 0.03);
  EXPECT_NEAR(counts[2] / double{kTrials}, 1.0 / 6, 0.03);
  EXPECT_EQ(counts.count(3), 0u);  // the worst of the near-best never wins a pair
}

TEST(ChooseByCostTest, EqualCostsGoToFewerInFlight) {
  PolicyOptions o;
  SplitMix64 rng(3);
  std::vector<Candidate> c = Slots(2);
  c[0].in_flight = 5;
  c[1].in_flight = 1;
  const std::vector<double> costs = {100, 100};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ChooseByCost(c, costs, o, &rng), 1u);
}

TEST(ChooseLeastLoadedTest, PicksFewestOutstandingAndSpreadsTies) {
  SplitMix64 rng(5);
  std::vector<Candidate> c = Slots(4);
  c[0].running = 3;
  c[1].running = 1;
  c[1].waiting = 1;
  c[2].running = 2;
  c[3].running = 5;
  std::map<size_t, int> counts;
  for (int i = 0; i < 3000; ++i) ++counts[ChooseLeastLoaded(c, &rng)];
  EXPECT_EQ(counts.size(), 2u);  // slots 1 and 2 tie at 2
  EXPECT_NEAR(counts[1] / 3000.0, 0.5, 0.05);
  EXPECT_NEAR(counts[2] / 3000.0, 0.5, 0.05);
}

TEST(ChooseRoundRobinTest, CyclesBySlotAndSurvivesChangingSets) {
  int last = -1;
  std::vector<Candidate> c = Slots(3);  // slots 0 1 2
  std::vector<int> order;
  for (int i = 0; i < 6; ++i) order.push_back(c[ChooseRoundRobin(c, &last)].slot);
  EXPECT_THAT(order, ::testing::ElementsAre(0, 1, 2, 0, 1, 2));
  // Slot 1 leaves, slot 5 joins: the rotation continues after the last slot.
  c = Slots(3);
  c[1].slot = 2;
  c[2].slot = 5;
  last = 0;
  order.clear();
  for (int i = 0; i < 4; ++i) order.push_back(c[ChooseRoundRobin(c, &last)].slot);
  EXPECT_THAT(order, ::testing::ElementsAre(2, 5, 0, 2));
}

TEST(AffinityTableTest, BindsLooksUpExpiresAndStaysBounded) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  AffinityTable table(/*max_keys=*/2, /*ttl=*/absl::Seconds(10));
  const WorkerRef a{0, 1}, b{1, 2};
  EXPECT_FALSE(table.Lookup("s1", t0).has_value());
  table.Bind("s1", a, t0);
  EXPECT_EQ(*table.Lookup("s1", t0 + absl::Seconds(5)), a);
  table.Bind("s1", b, t0 + absl::Seconds(6));  // re-bind
  EXPECT_EQ(*table.Lookup("s1", t0 + absl::Seconds(6)), b);
  EXPECT_FALSE(table.Lookup("s1", t0 + absl::Seconds(17)).has_value());  // expired
  EXPECT_EQ(table.size(), 0u);

  table.Bind("x", a, t0);
  table.Bind("y", a, t0);
  table.Bind("z", b, t0);  // over the bound: the least recent ("x") goes
  EXPECT_EQ(table.size(), 2u);
  EXPECT_FALSE(table.Lookup("x", t0).has_value());
  EXPECT_TRUE(table.Lookup("y", t0).has_value());
  table.Erase("y");
  EXPECT_FALSE(table.Lookup("y", t0).has_value());
}

TEST(SplitMix64Test, UniformStaysInRangeAndCoversIt) {
  SplitMix64 rng(11);
  std::vector<int> seen(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const uint64_t x = rng.Uniform(7);
    ASSERT_LT(x, 7u);
    ++seen[x];
  }
  for (int n : seen) EXPECT_NEAR(n, 1000, 150);
}

}  // namespace
}  // namespace tessera::router
