// Clock: the source of "now" for the router's time-based decisions (breaker
// back-off, load staleness, prediction TTLs, completion rates), so tests can
// drive time by hand.
//
// Thread-safety: SystemClock and FakeClock are safe to use from any thread.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera::router {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// Wall-clock time (absl::Now()).
class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  // A process-wide instance; never destroyed.
  static const Clock* Get() {
    static const SystemClock* const clock = new SystemClock();
    return clock;
  }
};

// A clock that moves only when told to. Starts at an arbitrary fixed time.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace tessera::router
