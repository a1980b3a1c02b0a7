#include "services/router/tokenize_pool.h"

#include <utility>

namespace tessera::services {

TokenizePool::TokenizePool(int threads, int max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

TokenizePool::~TokenizePool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool TokenizePool::TrySubmit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(queue_.size()) >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void TokenizePool::Work() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace tessera::services
