#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace tessera::kernels::cpu {
namespace {

// About 20-50 microseconds of pause instructions.
constexpr int kSpinIterations = 1000;

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Set on pool worker threads and while a thread runs a loop body, so that a
// nested ParallelFor runs inline instead of waiting on itself.
thread_local bool t_inside_parallel_for = false;

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::DefaultThreadCount() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::RunChunks(Job& job) {
  while (true) {
    const int64_t begin = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (begin >= job.n) return;
    job.fn(begin, std::min(job.n, begin + job.grain));
  }
}

void ThreadPool::WorkerLoop() {
  t_inside_parallel_for = true;
  uint64_t seen = 0;
  while (true) {
    // Spin briefly before sleeping: a decode step issues one parallel loop
    // after another, and a futex wake-up costs more than a small kernel.
    for (int i = 0; i < kSpinIterations && published_.load(std::memory_order_acquire) == seen;
         ++i) {
      CpuRelax();
    }
    Job* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      job = job_;
      if (job == nullptr) continue;
      active_.fetch_add(1, std::memory_order_relaxed);  // under mu_: see ParallelFor
    }
    RunChunks(*job);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      absl::MutexLock lock(&mu_);
      done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain || t_inside_parallel_for) {
    fn(0, n);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  Job job{fn, n, grain};
  {
    absl::MutexLock lock(&mu_);
    job_ = &job;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
    work_cv_.SignalAll();
  }
  t_inside_parallel_for = true;
  RunChunks(job);
  t_inside_parallel_for = false;
  {
    // Workers take the job and count themselves in active_ under mu_, so
    // after this no worker can join, and active_ only falls.
    absl::MutexLock lock(&mu_);
    job_ = nullptr;
  }
  for (int i = 0; i < kSpinIterations && active_.load(std::memory_order_acquire) > 0; ++i) {
    CpuRelax();
  }
  absl::MutexLock lock(&mu_);
  while (active_.load(std::memory_order_acquire) > 0) done_cv_.Wait(&mu_);
}

ThreadPool* DefaultThreadPool() {
  static ThreadPool* pool = new ThreadPool(ThreadPool::DefaultThreadCount());
  return pool;
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

}  // namespace tessera::kernels::cpu
