#include "worker/parallel/lockstep.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::parallel {

LockstepRanks::LockstepRanks(int size, std::function<absl::Status(int rank)> step)
    : size_(size), step_(std::move(step)) {
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

void LockstepRanks::Loop(int rank) {
  int64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && round_ == seen) cv_.Wait(&mu_);
      if (stop_) return;
      seen = round_;
    }
    absl::Status s = step_(rank);
    absl::MutexLock lock(&mu_);
    status_[rank] = std::move(s);
    if (--pending_ == 0) cv_.SignalAll();
  }
}

absl::Status LockstepRanks::Run() {
  {
    absl::MutexLock lock(&mu_);
    pending_ = size_ - 1;
    ++round_;
    cv_.SignalAll();
  }
  absl::Status s = step_(0);
  absl::MutexLock lock(&mu_);
  while (pending_ > 0) cv_.Wait(&mu_);
  if (!s.ok()) return s;
  for (int r = 1; r < size_; ++r) {
    if (!status_[r].ok()) {
      return absl::Status(status_[r].code(), absl::StrCat("rank ", r, ": ", status_[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::parallel
