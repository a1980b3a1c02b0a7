#include "services/common/drain.h"

#include <thread>

#include "gtest/gtest.h"

namespace tessera::services {
namespace {

TEST(DrainStateTest, RefusesNewWorkOnceDraining) {
  DrainState state;
  {
    WorkGuard before(&state);
    EXPECT_TRUE(before.ok());
    EXPECT_EQ(state.in_flight(), 1);
    EXPECT_TRUE(state.Begin(absl::Seconds(5), "test"));
    WorkGuard after(&state);
    EXPECT_FALSE(after.ok());
    EXPECT_EQ(state.in_flight(), 1);
  }
  EXPECT_EQ(state.in_flight(), 0);
  EXPECT_TRUE(state.WaitIdleUntil(absl::Now()));
}

TEST(DrainStateTest, SecondBeginOnlyShortensTheDeadline) {
  DrainState state;
  EXPECT_TRUE(state.Begin(absl::Seconds(30), "first"));
  absl::Time first = state.deadline();
  EXPECT_FALSE(state.Begin(absl::Seconds(60), "later"));
  EXPECT_EQ(state.deadline(), first);
  EXPECT_FALSE(state.Begin(absl::ZeroDuration(), "cut"));
  EXPECT_LT(state.deadline(), first);
  EXPECT_EQ(state.reason(), "first");
}

TEST(DrainStateTest, WaitIdleReturnsWhenWorkLeaves) {
  DrainState state;
  auto guard = std::make_unique<WorkGuard>(&state);
  state.Begin(absl::Seconds(5), "test");
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(50));
    guard.reset();
  });
  EXPECT_TRUE(state.WaitIdleUntil(absl::Now() + absl::Seconds(5)));
  t.join();
  EXPECT_FALSE(state.WaitFinishedFor(absl::Milliseconds(1)));
  state.Finish();
  EXPECT_TRUE(state.WaitFinishedFor(absl::Milliseconds(1)));
}

TEST(DrainStateTest, WaitIdleTimesOutWhileWorkIsInFlight) {
  DrainState state;
  WorkGuard guard(&state);
  EXPECT_FALSE(state.WaitIdleUntil(absl::Now() + absl::Milliseconds(20)));
}

}  // namespace
}  // namespace tessera::services
