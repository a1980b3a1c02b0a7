// A small reusable thread pool for the CPU kernels: ParallelFor splits an
// index range into chunks that the calling thread and the pool's workers
// claim until none are left. Idle workers spin for ~25 microseconds before
// sleeping, and so does a caller waiting for them, so that the many short
// parallel loops of a decode step do not each pay a futex wake-up.
//
// Thread-safety: ParallelFor may be called from any thread. Calls from
// different threads are serialized (one parallel loop runs at a time); a
// ParallelFor issued from inside a running loop body runs inline on the
// calling thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tessera::kernels::cpu {

class ThreadPool {
 public:
  // `num_threads` is the total parallelism: the caller of ParallelFor plus
  // num_threads - 1 worker threads. Values below 1 mean 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint chunks that together cover [0, n), each
  // `grain` items long except possibly the last, and returns when all are
  // done. Chunks run concurrently in no particular order.
  // REQUIRES: grain >= 1; fn is safe to run concurrently on disjoint chunks.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

  // Hardware concurrency (at least 1).
  static int DefaultThreadCount();

 private:
  struct Job {
    absl::FunctionRef<void(int64_t, int64_t)> fn;
    int64_t n;
    int64_t grain;
    std::atomic<int64_t> next{0};
  };

  static void RunChunks(Job& job);
  void WorkerLoop();

  const int num_threads_;
  std::vector<std::thread> workers_;
  absl::Mutex call_mu_;  // held for the duration of one ParallelFor
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // a new job or stop_
  absl::CondVar done_cv_;  // active_ dropped to zero (signalled under mu_)
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without mu_ (for spinning)
  Job* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<int> active_{0};  // workers holding job_; incremented only under mu_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// A process-wide pool with DefaultThreadCount() threads, created on first use.
ThreadPool* DefaultThreadPool();

// Runs fn over [0, n) on `pool`, or inline on the caller when pool is null.
void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace tessera::kernels::cpu
