// TokenizePool: runs what it takes on its own threads, refuses work beyond
// its queue bound, and runs what is queued before it stops.
#include "services/router/tokenize_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera::services {
namespace {

TEST(TokenizePoolTest, RefusesBeyondItsQueueAndRunsWhatItQueued) {
  std::atomic<int> ran{0};
  absl::Notification release, busy;
  {
    TokenizePool pool(/*threads=*/1, /*max_queued=*/2);
    // The one thread is held; then two tasks wait, and a third is refused.
    ASSERT_TRUE(pool.TrySubmit([&] {
      busy.Notify();
      release.WaitForNotification();
      ran.fetch_add(1);
    }));
    ASSERT_TRUE(busy.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(pool.TrySubmit([&] { ran.fetch_add(1); }));
    EXPECT_TRUE(pool.TrySubmit([&] { ran.fetch_add(1); }));
    EXPECT_FALSE(pool.TrySubmit([&] { ran.fetch_add(100); }));
    release.Notify();
  }  // the destructor runs the queued tasks, then joins
  EXPECT_EQ(ran.load(), 3);
}

}  // namespace
}  // namespace tessera::services
