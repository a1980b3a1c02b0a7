// DrainState: the shared state of a service that is shutting down gracefully.
//
// Drain sequence (ServiceHost drives it): Begin() → readiness turns
// NOT_SERVING → new work is refused → in-flight work (tracked with
// WorkGuard) finishes or the deadline passes → Finish() → long-lived streams
// (load reports, health watches) end → the gRPC server shuts down.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera::services {

class DrainState {
 public:
  DrainState() = default;
  DrainState(const DrainState&) = delete;
  DrainState& operator=(const DrainState&) = delete;

  // Starts draining with the given deadline for in-flight work. Returns false
  // when already draining (a second call may only shorten the deadline).
  bool Begin(absl::Duration deadline, std::string reason);
  bool draining() const;
  std::string reason() const;
  absl::Time deadline() const;

  // Marks draining complete: in-flight work is done or timed out.
  void Finish();
  bool finished() const;
  // Waits until Finish() or the timeout; returns finished().
  bool WaitFinishedFor(absl::Duration timeout) const;
  // Waits until Begin() was called or the timeout; returns draining().
  bool WaitDrainingFor(absl::Duration timeout) const;

  // Counts one in-flight unit of work (a Generate call, ...). TryEnter fails
  // once draining has begun.
  bool TryEnter();
  void Leave();
  int in_flight() const;
  // Waits until no work is in flight or `until` passes; returns true if idle.
  bool WaitIdleUntil(absl::Time until) const;

 private:
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// RAII registration of in-flight work; ok() is false when the service is
// draining and the work must be refused.
class WorkGuard {
 public:
  explicit WorkGuard(DrainState* state) : state_(state), ok_(state->TryEnter()) {}
  ~WorkGuard() {
    if (ok_) state_->Leave();
  }
  WorkGuard(const WorkGuard&) = delete;
  WorkGuard& operator=(const WorkGuard&) = delete;
  bool ok() const { return ok_; }

 private:
  DrainState* state_;
  bool ok_;
};

}  // namespace tessera::services
