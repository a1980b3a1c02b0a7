#include "worker/parallel/lockstep.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::parallel {

LockstepRanks::LockstepRanks(int size, std::function<absl::Status(int rank)> step, bool spin)
    : size_(size), step_(std::move(step)), spin_(spin) {
  {
    absl::MutexLock lock(&mu_);
    status_.assign(size_, absl::OkStatus());
  }
  for (int r = 1; r < size_; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

LockstepRanks::~LockstepRanks() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

template <class Pred>
void LockstepRanks::SpinUntil(Pred pred) const {
  if (!spin_) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  while (!pred() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

void LockstepRanks::Loop(int rank) {
  int64_t seen = 0;
  for (;;) {
    SpinUntil([&] { return round_.load(std::memory_order_acquire) != seen; });
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && round_.load(std::memory_order_relaxed) == seen) cv_.Wait(&mu_);
      if (stop_) return;
      seen = round_.load(std::memory_order_relaxed);
    }
    absl::Status s = step_(rank);
    absl::MutexLock lock(&mu_);
    status_[rank] = std::move(s);
    if (pending_.fetch_sub(1, std::memory_order_release) == 1) cv_.SignalAll();
  }
}

absl::Status LockstepRanks::Run() {
  {
    absl::MutexLock lock(&mu_);
    pending_.store(size_ - 1, std::memory_order_relaxed);
    round_.fetch_add(1, std::memory_order_release);
    cv_.SignalAll();
  }
  absl::Status s = step_(0);
  SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; });
  absl::MutexLock lock(&mu_);
  while (pending_.load(std::memory_order_relaxed) > 0) cv_.Wait(&mu_);
  if (!s.ok()) return s;
  for (int r = 1; r < size_; ++r) {
    if (!status_[r].ok()) {
      return absl::Status(status_[r].code(), absl::StrCat("rank ", r, ": ", status_[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::parallel
