#include "router/admission.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

using ::testing::HasSubstr;

AdmissionOptions Small(int max_in_flight, int max_queued = 8) {
  AdmissionOptions o;
  o.max_in_flight = max_in_flight;
  o.max_queued_per_priority = max_queued;
  o.min_retry_after = absl::Milliseconds(1);
  o.max_retry_after = absl::Seconds(60);
  o.default_retry_after = absl::Milliseconds(500);
  return o;
}

// Waits (really) until `n` requests are queued in `c`.
void WaitQueued(const AdmissionController& c, int n) {
  for (int i = 0; i < 5000; ++i) {
    const AdmissionStats s = c.Stats();
    int q = 0;
    for (int x : s.queued) q += x;
    if (q >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL() << "waiters never queued";
}

TEST(AdmissionTest, TryAdmitUpToTheLimitThenRefusesWithAHint) {
  FakeClock clock;
  AdmissionController c(Small(2), &clock);
  absl::StatusOr<AdmissionTicket> a = c.TryAdmit(Priority::kNormal);
  absl::StatusOr<AdmissionTicket> b = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<AdmissionTicket> refused = c.TryAdmit(Priority::kHigh);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  std::optional<absl::Duration> hint = RetryAfterFromStatus(refused.status());
  ASSERT_TRUE(hint.has_value());
  EXPECT_EQ(*hint, absl::Milliseconds(500));  // no completions yet: the default
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("retry after 500 ms"));
  a->Release();
  EXPECT_TRUE(c.TryAdmit(Priority::kLow).ok());  // the slot is free again (and released)
  EXPECT_EQ(c.Stats().in_flight, 1);
  EXPECT_EQ(c.Stats().refused_full, 1u);
}

TEST(AdmissionTest, TicketsReleaseOnceWhenMovedOrDestroyed) {
  AdmissionController c(Small(1));
  {
    absl::StatusOr<AdmissionTicket> t = c.TryAdmit(Priority::kNormal);
    ASSERT_TRUE(t.ok());
    AdmissionTicket moved = std::move(*t);
    EXPECT_FALSE(t->valid());
    EXPECT_TRUE(moved.valid());
    AdmissionTicket again;
    again = std::move(moved);
    EXPECT_EQ(c.Stats().in_flight, 1);
  }
  EXPECT_EQ(c.Stats().in_flight, 0);
  EXPECT_TRUE(c.TryAdmit(Priority::kNormal).ok());
}

TEST(AdmissionTest, WaiterGetsTheReleasedSlot) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> admitted{false};
  absl::Duration queued;
  std::thread waiter([&] {
    absl::StatusOr<AdmissionTicket> t = c.Admit(Priority::kNormal, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(t.ok()) << t.status();
    queued = t->queued();
    admitted = true;
  });
  WaitQueued(c, 1);
  EXPECT_FALSE(admitted.load());
  // A newcomer of the same class does not overtake the waiter.
  EXPECT_EQ(c.TryAdmit(Priority::kNormal).status().code(), absl::StatusCode::kResourceExhausted);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  held->Release();
  waiter.join();
  EXPECT_TRUE(admitted.load());
  EXPECT_GE(queued, absl::Milliseconds(15));
  EXPECT_EQ(c.Stats().in_flight, 0);
}

TEST(AdmissionTest, HigherPriorityWaitersAreAdmittedFirstFifoWithinAClass) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  std::mutex mu;
  std::vector<std::string> order;
  std::vector<std::thread> threads;
  auto spawn = [&](Priority p, std::string name, int queued_before) {
    threads.emplace_back([&, p, name] {
      absl::StatusOr<AdmissionTicket> t = c.Admit(p, absl::Now() + absl::Seconds(30));
      ASSERT_TRUE(t.ok());
      {
        std::lock_guard<std::mutex> l(mu);
        order.push_back(name);
      }
      // Holding the slot briefly keeps the order strict.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
    WaitQueued(c, queued_before + 1);
  };
  spawn(Priority::kLow, "low1", 0);
  spawn(Priority::kNormal, "normal1", 1);
  spawn(Priority::kHigh, "high1", 2);
  spawn(Priority::kNormal, "normal2", 3);
  spawn(Priority::kHigh, "high2", 4);
  held->Release();
  for (auto& t : threads) t.join();
  EXPECT_THAT(order, ::testing::ElementsAre("high1", "high2", "normal1", "normal2", "low1"));
}

TEST(AdmissionTest, FullQueueRefusesAndDeadlineAndCancelEndTheWait) {
  AdmissionController c(Small(1, /*max_queued=*/1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());

  absl::StatusOr<AdmissionTicket> late =
      c.Admit(Priority::kNormal, absl::Now() + absl::Milliseconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.Stats().queued[static_cast<int>(Priority::kNormal)], 0);  // it left the queue

  std::atomic<bool> cancelled{false};
  absl::Status waiter_status;
  std::thread waiter([&] {
    waiter_status =
        c.Admit(Priority::kNormal, absl::Now() + absl::Seconds(30), &cancelled).status();
  });
  WaitQueued(c, 1);
  // This class's queue (size 1) is full; another class still has room.
  absl::StatusOr<AdmissionTicket> full =
      c.Admit(Priority::kNormal, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(RetryAfterFromStatus(full.status()).has_value());
  cancelled = true;
  waiter.join();
  EXPECT_EQ(waiter_status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.Stats().timed_out, 2u);
}

TEST(AdmissionTest, DrainRefusesNewRequestsAndTurnsWaitersAway) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  absl::Status waiter_status;
  std::thread waiter(
      [&] { waiter_status = c.Admit(Priority::kHigh, absl::Now() + absl::Seconds(30)).status(); });
  WaitQueued(c, 1);
  c.StartDrain();
  waiter.join();
  EXPECT_EQ(waiter_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(c.draining());
  EXPECT_EQ(c.TryAdmit(Priority::kHigh).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.Admit(Priority::kHigh, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);

  // Admitted work runs on; WaitIdle waits for it.
  EXPECT_FALSE(c.WaitIdle(absl::Now() + absl::Milliseconds(10)));
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held->Release();
  });
  EXPECT_TRUE(c.WaitIdle(absl::Now() + absl::Seconds(30)));
  finisher.join();
}

TEST(AdmissionTest, RetryHintFollowsTheCompletionRateAndTheQueueAhead) {
  FakeClock clock;
  AdmissionOptions o = Small(4);
  o.rate_window = absl::Seconds(10);
  AdmissionController c(o, &clock);
  // 20 completions, one every 100 ms.
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<AdmissionTicket> t = c.TryAdmit(Priority::kNormal);
    ASSERT_TRUE(t.ok());
    clock.Advance(absl::Milliseconds(100));
    t->Release();
  }
  // The rate is 20 completions over the 1.9 s since the oldest one.
  const double rate = 20 / 1.9;
  EXPECT_NEAR(c.Stats().completions_per_second, rate, 1e-6);
  EXPECT_NEAR(absl::ToDoubleSeconds(c.RetryAfter(Priority::kNormal)), 1 / rate, 1e-6);

  // Three queued normal requests are ahead of another normal one, not of a
  // high one.
  std::vector<AdmissionTicket> held;
  for (int i = 0; i < 4; ++i) held.push_back(*c.TryAdmit(Priority::kNormal));
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      c.Admit(Priority::kNormal, absl::Now() + absl::Seconds(30)).status().IgnoreError();
    });
  }
  WaitQueued(c, 3);
  EXPECT_NEAR(absl::ToDoubleSeconds(c.RetryAfter(Priority::kNormal)), 4 / rate, 1e-6);
  EXPECT_NEAR(absl::ToDoubleSeconds(c.RetryAfter(Priority::kHigh)), 1 / rate, 1e-6);
  c.StartDrain();  // lets the waiters go
  for (auto& t : waiters) t.join();

  // Completions age out of the window: back to the default.
  clock.Advance(absl::Seconds(11));
  EXPECT_EQ(c.RetryAfter(Priority::kNormal), absl::Milliseconds(500));
}

TEST(AdmissionTest, RetryHintIsClamped) {
  FakeClock clock;
  AdmissionOptions o = Small(1);
  o.min_retry_after = absl::Milliseconds(200);
  o.max_retry_after = absl::Seconds(2);
  o.rate_window = absl::Seconds(60);
  AdmissionController c(o, &clock);
  for (int i = 0; i < 100; ++i) {
    clock.Advance(absl::Milliseconds(1));  // 1000 completions per second
    c.TryAdmit(Priority::kNormal)->Release();
  }
  EXPECT_EQ(c.RetryAfter(Priority::kNormal), absl::Milliseconds(200));
  AdmissionController slow(o, &clock);
  for (int i = 0; i < 2; ++i) {
    slow.TryAdmit(Priority::kNormal)->Release();
    clock.Advance(absl::Seconds(9));  // 2 completions in 18 s
  }
  EXPECT_EQ(slow.RetryAfter(Priority::kNormal), absl::Seconds(2));
}

TEST(AdmissionTest, ConcurrentAdmissionNeverExceedsTheLimit) {
  constexpr int kLimit = 3;
  AdmissionController c(Small(kLimit, /*max_queued=*/64));
  std::atomic<int> holding{0};
  std::atomic<int> peak{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const Priority p = static_cast<Priority>((t + i) % kNumPriorities);
        absl::StatusOr<AdmissionTicket> ticket = c.Admit(p, absl::Now() + absl::Seconds(60));
        ASSERT_TRUE(ticket.ok()) << ticket.status();
        const int now = holding.fetch_add(1) + 1;
        int seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
        if (i % 16 == 0) std::this_thread::yield();
        holding.fetch_sub(1);
        ticket->Release();
        done.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), 8 * 200);
  EXPECT_LE(peak.load(), kLimit);
  EXPECT_GE(peak.load(), 1);
  const AdmissionStats s = c.Stats();
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(s.admitted, 8u * 200u);
}

// --- The callback form (AdmitAsync) -------------------------------------------

// Collects the outcomes of AdmitAsync callbacks.
struct Outcomes {
  absl::Mutex mu;
  std::vector<absl::StatusOr<AdmissionTicket>> results ABSL_GUARDED_BY(mu);
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);

  AdmitCallback Callback() {
    return [this](absl::StatusOr<AdmissionTicket> r) {
      absl::MutexLock lock(&mu);
      results.push_back(std::move(r));
      threads.push_back(std::this_thread::get_id());
    };
  }
  int count() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(results.size());
  }
  bool WaitFor(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return static_cast<int>(results.size()) >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
};

TEST(AdmissionAsyncTest, DecidesAtOnceOnTheCallingThreadWhenItCan) {
  AdmissionController c(Small(1, /*max_queued=*/0));
  Outcomes out;
  EXPECT_EQ(c.AdmitAsync(Priority::kNormal, absl::Now() + absl::Seconds(5), out.Callback()), 0u);
  EXPECT_EQ(c.AdmitAsync(Priority::kHigh, absl::Now() + absl::Seconds(5), out.Callback()), 0u);
  ASSERT_EQ(out.count(), 2);  // both ran before AdmitAsync returned
  absl::MutexLock lock(&out.mu);
  ASSERT_TRUE(out.results[0].ok());
  EXPECT_EQ(out.results[0]->queued(), absl::ZeroDuration());
  EXPECT_EQ(out.threads[0], std::this_thread::get_id());
  // No queue places: refused with a hint.
  EXPECT_EQ(out.results[1].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(RetryAfterFromStatus(out.results[1].status()).has_value());
  EXPECT_EQ(c.Stats().in_flight, 1);
}

TEST(AdmissionAsyncTest, WaiterGetsTheSlotOnTheReleasingThread) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  Outcomes out;
  const uint64_t id =
      c.AdmitAsync(Priority::kNormal, absl::Now() + absl::Seconds(30), out.Callback());
  EXPECT_GT(id, 0u);
  EXPECT_EQ(out.count(), 0);
  EXPECT_EQ(c.Stats().queued[static_cast<int>(Priority::kNormal)], 1);
  // A newcomer does not overtake it.
  EXPECT_EQ(c.TryAdmit(Priority::kNormal).status().code(), absl::StatusCode::kResourceExhausted);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread releaser([&] { held->Release(); });
  const std::thread::id releaser_id = releaser.get_id();
  releaser.join();
  ASSERT_EQ(out.count(), 1);
  {
    absl::MutexLock lock(&out.mu);
    ASSERT_TRUE(out.results[0].ok()) << out.results[0].status();
    EXPECT_EQ(out.threads[0], releaser_id);
    EXPECT_GE(out.results[0]->queued(), absl::Milliseconds(15));
    EXPECT_EQ(c.Stats().in_flight, 1);
    EXPECT_FALSE(c.CancelWait(id)) << "the wait already ended";
    out.results[0]->Release();
  }
  EXPECT_EQ(c.Stats().in_flight, 0);
  EXPECT_EQ(c.Stats().admitted, 2u);
}

TEST(AdmissionAsyncTest, BlockingAndCallbackWaitersShareOneOrder) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  absl::Mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    absl::MutexLock lock(&mu);
    order.push_back(std::move(name));
  };
  // Each callback waiter releases its slot at once, from inside its
  // callback: the next hand-over runs after it, on the same thread.
  auto async = [&](Priority p, std::string name) {
    c.AdmitAsync(p, absl::Now() + absl::Seconds(30), [&, name](absl::StatusOr<AdmissionTicket> t) {
      ASSERT_TRUE(t.ok()) << t.status();
      record(name);
    });
  };
  async(Priority::kLow, "low-async");
  std::thread blocking([&] {
    absl::StatusOr<AdmissionTicket> t = c.Admit(Priority::kNormal, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(t.ok());
    record("normal-blocking");
  });
  WaitQueued(c, 2);
  async(Priority::kHigh, "high-async");
  async(Priority::kNormal, "normal-async");
  held->Release();
  // The blocking waiter's release hands the slot to the remaining callback
  // waiters on its own thread, before it ends.
  blocking.join();
  absl::MutexLock lock(&mu);
  EXPECT_THAT(order,
              ::testing::ElementsAre("high-async", "normal-blocking", "normal-async", "low-async"));
  EXPECT_EQ(c.Stats().in_flight, 0);
}

TEST(AdmissionAsyncTest, DeadlinesEndWaitsInDeadlineOrderWithoutPolling) {
  AdmissionOptions o = Small(1);
  o.cancel_poll = absl::Hours(1);  // the callback form must not depend on it
  AdmissionController c(o);
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> ended;
  auto wait = [&](std::string name, absl::Duration d) {
    return c.AdmitAsync(Priority::kNormal, absl::Now() + d,
                        [&, name](absl::StatusOr<AdmissionTicket> t) {
                          absl::MutexLock lock(&mu);
                          ended.emplace_back(name, t.status());
                        });
  };
  const absl::Time start = absl::Now();
  wait("later", absl::Milliseconds(2000));
  wait("sooner", absl::Milliseconds(60));  // an earlier deadline added second
  {
    absl::MutexLock lock(&mu);
    auto one = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !ended.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(10)));
    EXPECT_EQ(ended[0].first, "sooner");
    EXPECT_EQ(ended[0].second.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(ended[0].second.message()), HasSubstr("admission queue"));
    const absl::Duration took = absl::Now() - start;
    EXPECT_GE(took, absl::Milliseconds(55));
    // Waiting for the later deadline would take 2 s.
    EXPECT_LT(took, absl::Milliseconds(1000)) << "the sooner deadline waited for the later one";
    auto two = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ended.size() == 2; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)));
    EXPECT_EQ(ended[1].first, "later");
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1995));
  EXPECT_EQ(c.Stats().queued[static_cast<int>(Priority::kNormal)], 0);
  EXPECT_EQ(c.Stats().timed_out, 2u);
  // A deadline already past is decided at once.
  Outcomes out;
  EXPECT_EQ(c.AdmitAsync(Priority::kNormal, absl::Now() - absl::Seconds(1), out.Callback()), 0u);
  absl::MutexLock lock(&out.mu);
  ASSERT_EQ(out.results.size(), 1u);
  EXPECT_EQ(out.results[0].status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(AdmissionAsyncTest, CancelWaitEndsTheWaitOnceAndFreesItsQueuePlace) {
  AdmissionController c(Small(1, /*max_queued=*/1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  Outcomes out;
  const uint64_t id =
      c.AdmitAsync(Priority::kNormal, absl::Now() + absl::Seconds(30), out.Callback());
  ASSERT_GT(id, 0u);
  // The queue (one place) is full.
  Outcomes refused;
  c.AdmitAsync(Priority::kNormal, absl::Now() + absl::Seconds(30), refused.Callback());
  ASSERT_EQ(refused.count(), 1);
  EXPECT_TRUE(c.CancelWait(id));
  ASSERT_EQ(out.count(), 1);  // ran on this thread, before CancelWait returned
  {
    absl::MutexLock lock(&out.mu);
    EXPECT_EQ(out.results[0].status().code(), absl::StatusCode::kCancelled);
  }
  EXPECT_FALSE(c.CancelWait(id));
  EXPECT_FALSE(c.CancelWait(987654));
  EXPECT_EQ(out.count(), 1);
  EXPECT_EQ(c.Stats().timed_out, 1u);
  // Its place is free again, and the released slot goes to the new waiter.
  Outcomes next;
  EXPECT_GT(c.AdmitAsync(Priority::kNormal, absl::Now() + absl::Seconds(30), next.Callback()), 0u);
  held->Release();
  ASSERT_EQ(next.count(), 1);
  absl::MutexLock lock(&next.mu);
  EXPECT_TRUE(next.results[0].ok());
  EXPECT_EQ(c.Stats().in_flight, 1);
}

TEST(AdmissionAsyncTest, DrainTurnsCallbackWaitersAway) {
  AdmissionController c(Small(1));
  absl::StatusOr<AdmissionTicket> held = c.TryAdmit(Priority::kNormal);
  ASSERT_TRUE(held.ok());
  Outcomes out;
  const uint64_t id =
      c.AdmitAsync(Priority::kHigh, absl::Now() + absl::Seconds(30), out.Callback());
  c.StartDrain();
  ASSERT_EQ(out.count(), 1);
  {
    absl::MutexLock lock(&out.mu);
    EXPECT_EQ(out.results[0].status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_FALSE(c.CancelWait(id));
  c.AdmitAsync(Priority::kHigh, absl::Now() + absl::Seconds(30), out.Callback());
  ASSERT_EQ(out.count(), 2);
  absl::MutexLock lock(&out.mu);
  EXPECT_EQ(out.results[1].status().code(), absl::StatusCode::kUnavailable);
}

TEST(AdmissionAsyncTest, ConcurrentCallbacksRunOnceAndNeverExceedTheLimit) {
  constexpr int kLimit = 3;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  AdmissionController c(Small(kLimit, /*max_queued=*/1000));
  std::atomic<int> holding{0}, peak{0}, admitted{0}, cancelled{0}, calls{0};
  // Tickets handed to the callbacks are kept a moment by a releaser thread.
  absl::Mutex mu;
  std::deque<AdmissionTicket> held;
  std::atomic<bool> stop{false};
  std::thread releaser([&] {
    while (!stop.load() || c.Stats().in_flight > 0) {
      std::optional<AdmissionTicket> t;
      {
        absl::MutexLock lock(&mu);
        if (!held.empty()) {
          t = std::move(held.front());
          held.pop_front();
        }
      }
      if (!t) {
        std::this_thread::yield();
        continue;
      }
      holding.fetch_sub(1);
      t->Release();
    }
  });
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kPerThread; ++i) {
        const Priority p = static_cast<Priority>((k + i) % kNumPriorities);
        const uint64_t id = c.AdmitAsync(
            p, absl::Now() + absl::Seconds(60), [&](absl::StatusOr<AdmissionTicket> t) {
              calls.fetch_add(1);
              if (!t.ok()) {
                cancelled.fetch_add(1);
                return;
              }
              admitted.fetch_add(1);
              const int now = holding.fetch_add(1) + 1;
              int seen = peak.load();
              while (now > seen && !peak.compare_exchange_weak(seen, now)) {
              }
              absl::MutexLock lock(&mu);
              held.push_back(std::move(*t));
            });
        if (id != 0 && i % 3 == 0) c.CancelWait(id);  // may lose the race to a grant
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 5000 && calls.load() < kThreads * kPerThread; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  stop = true;
  releaser.join();
  EXPECT_EQ(calls.load(), kThreads * kPerThread) << "every callback runs exactly once";
  EXPECT_EQ(admitted.load() + cancelled.load(), kThreads * kPerThread);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_LE(peak.load(), kLimit);
  const AdmissionStats s = c.Stats();
  EXPECT_EQ(s.in_flight, 0);
  for (int q : s.queued) EXPECT_EQ(q, 0);
  EXPECT_EQ(s.admitted, static_cast<uint64_t>(admitted.load()));
  EXPECT_EQ(s.timed_out, static_cast<uint64_t>(cancelled.load()));
}

}  // namespace
}  // namespace tessera::router
