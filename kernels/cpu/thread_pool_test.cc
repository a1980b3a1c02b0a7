#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tessera::kernels::cpu {
namespace {

// Runs ParallelFor and returns how often each index was visited.
std::vector<int> Visits(ThreadPool* pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> counts(n);
  ParallelFor(pool, n, grain, [&](int64_t b, int64_t e) {
    EXPECT_LE(0, b);
    EXPECT_LT(b, e);
    EXPECT_LE(e, n);
    for (int64_t i = b; i < e; ++i) counts[i].fetch_add(1);
  });
  std::vector<int> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    for (int64_t grain : {1, 3, 64, 5000}) {
      EXPECT_EQ(Visits(&pool, n, grain), std::vector<int>(n, 1)) << n << " " << grain;
    }
  }
}

TEST(ThreadPoolTest, NullPoolAndSingleThreadRunInline) {
  ThreadPool single(1);
  EXPECT_EQ(single.num_threads(), 1);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &single}) {
    std::set<std::thread::id> ids;
    ParallelFor(pool, 100, 1, [&](int64_t, int64_t) { ids.insert(std::this_thread::get_id()); });
    EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  }
}

TEST(ThreadPoolTest, ZeroItemsCallsNothing) {
  ThreadPool pool(3);
  bool called = false;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPoolTest, WorkSpreadsOverSeveralThreads) {
  ThreadPool pool(3);
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  // Three chunks that wait for each other can only finish if three threads run them.
  pool.ParallelFor(3, 1, [&](int64_t, int64_t) {
    {
      absl::MutexLock lock(&mu);
      ids.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 3u);
}

TEST(ThreadPoolTest, NestedParallelForRunsInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(6, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, 1, [&](int64_t bb, int64_t ee) { total.fetch_add(ee - bb); });
    }
  });
  EXPECT_EQ(total.load(), 60);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerializedAndComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(100, 7, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 100);
}

TEST(ThreadPoolTest, DefaultPoolUsesHardwareConcurrency) {
  EXPECT_EQ(DefaultThreadPool()->num_threads(), ThreadPool::DefaultThreadCount());
  EXPECT_GE(ThreadPool::DefaultThreadCount(), 1);
  EXPECT_EQ(DefaultThreadPool(), DefaultThreadPool());
}

}  // namespace
}  // namespace tessera::kernels::cpu
