#include "services/common/drain.h"

#include <utility>

namespace tessera::services {

bool DrainState::Begin(absl::Duration deadline, std::string reason) {
  absl::MutexLock lock(&mu_);
  absl::Time until = absl::Now() + deadline;
  if (draining_) {
    if (until < deadline_) deadline_ = until;
    return false;
  }
  draining_ = true;
  reason_ = std::move(reason);
  deadline_ = until;
  return true;
}

bool DrainState::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

std::string DrainState::reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

absl::Time DrainState::deadline() const {
  absl::MutexLock lock(&mu_);
  return deadline_;
}

void DrainState::Finish() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
}

bool DrainState::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

bool DrainState::WaitFinishedFor(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
  return finished_;
}

bool DrainState::WaitDrainingFor(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&draining_), timeout);
  return draining_;
}

bool DrainState::TryEnter() {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  ++in_flight_;
  return true;
}

void DrainState::Leave() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

int DrainState::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

bool DrainState::WaitIdleUntil(absl::Time until) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), until);
  return in_flight_ == 0;
}

}  // namespace tessera::services
