#include "router/admission.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::router {
namespace {

absl::string_view PayloadUrl() {
  return absl::string_view(kRetryAfterPayloadUrl.data(), kRetryAfterPayloadUrl.size());
}

}  // namespace

std::optional<absl::Duration> RetryAfterFromStatus(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(PayloadUrl());
  if (!payload.has_value()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

// --- AdmissionTicket -----------------------------------------------------------

AdmissionTicket& AdmissionTicket::operator=(AdmissionTicket&& other) noexcept {
  if (this != &other) {
    Release();
    controller_ = other.controller_;
    priority_ = other.priority_;
    queued_ = other.queued_;
    other.controller_ = nullptr;
  }
  return *this;
}

void AdmissionTicket::Release() {
  if (controller_ == nullptr) return;
  AdmissionController* c = controller_;
  controller_ = nullptr;
  c->ReleaseSlot();
}

// --- AdmissionController -------------------------------------------------------

struct AdmissionController::Waiter {
  Priority priority;
  bool granted = false;
  bool refused = false;  // drain started
  absl::CondVar cv;
  // Async waiters only (wait_id > 0): the callback, the deadline, and when
  // the wait began.
  uint64_t wait_id = 0;
  AdmitCallback done;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time start;
};

namespace {

using PendingCallbacks = std::vector<std::pair<AdmitCallback, absl::StatusOr<AdmissionTicket>>>;

// The callbacks this thread is running now, when it is inside RunCallbacks.
thread_local std::deque<std::pair<AdmitCallback, absl::StatusOr<AdmissionTicket>>>* tls_running =
    nullptr;

// Runs callbacks collected under the controller's lock, after it is released.
// A callback that releases a ticket (or cancels, or admits) makes more
// callbacks ready; on this thread they are queued behind the current one
// rather than run nested, so a chain of hand-overs never deepens the stack.
void RunCallbacks(PendingCallbacks& callbacks) {
  if (callbacks.empty()) return;
  if (tls_running != nullptr) {
    for (auto& c : callbacks) tls_running->push_back(std::move(c));
    callbacks.clear();
    return;
  }
  std::deque<std::pair<AdmitCallback, absl::StatusOr<AdmissionTicket>>> queue;
  for (auto& c : callbacks) queue.push_back(std::move(c));
  callbacks.clear();
  tls_running = &queue;
  while (!queue.empty()) {
    auto [done, result] = std::move(queue.front());
    queue.pop_front();
    done(std::move(result));
  }
  tls_running = nullptr;
}

}  // namespace

AdmissionController::AdmissionController(AdmissionOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

AdmissionController::~AdmissionController() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    deadline_cv_.SignalAll();
  }
  if (deadline_thread_.joinable()) deadline_thread_.join();
}

int AdmissionController::WaitersAtOrAboveLocked(Priority priority) const {
  int n = 0;
  for (int p = static_cast<int>(priority); p < kNumPriorities; ++p) {
    n += static_cast<int>(queues_[p].size());
  }
  return n;
}

bool AdmissionController::CanAdmitNowLocked(Priority priority) const {
  return in_flight_ < std::max(1, options_.max_in_flight) && WaitersAtOrAboveLocked(priority) == 0;
}

double AdmissionController::CompletionRateLocked(absl::Time now) const {
  while (!completions_.empty() && now - completions_.front() > options_.rate_window) {
    completions_.pop_front();
  }
  if (completions_.size() < 2) return 0;
  const double seconds = std::max(absl::ToDoubleSeconds(now - completions_.front()), 1e-3);
  return static_cast<double>(completions_.size()) / seconds;
}

absl::Duration AdmissionController::RetryAfterLocked(Priority priority) const {
  const double rate = CompletionRateLocked(clock_->Now());
  absl::Duration hint = options_.default_retry_after;
  if (rate > 0) {
    const double ahead = WaitersAtOrAboveLocked(priority) + 1;
    hint = absl::Seconds(ahead / rate);
  }
  return std::clamp(hint, options_.min_retry_after, options_.max_retry_after);
}

absl::Duration AdmissionController::RetryAfter(Priority priority) const {
  absl::MutexLock lock(&mu_);
  return RetryAfterLocked(priority);
}

absl::Status AdmissionController::FullLocked(Priority priority, std::string_view what) {
  ++counters_.refused_full;
  // Rounded up, so that a hint is never shorter than the estimate.
  const int64_t ms =
      static_cast<int64_t>(std::ceil(absl::ToDoubleMilliseconds(RetryAfterLocked(priority))));
  absl::Status status = absl::ResourceExhaustedError(
      absl::StrCat("the router is at capacity (", std::string(what), "); retry after ", ms, " ms"));
  status.SetPayload(PayloadUrl(), absl::Cord(absl::StrCat(ms)));
  return status;
}

absl::Status AdmissionController::DrainingLocked() {
  ++counters_.refused_draining;
  return absl::UnavailableError("the router is draining and accepts no new requests");
}

absl::StatusOr<AdmissionTicket> AdmissionController::TryAdmit(Priority priority) {
  absl::MutexLock lock(&mu_);
  if (draining_) return DrainingLocked();
  if (!CanAdmitNowLocked(priority)) {
    return FullLocked(priority, absl::StrCat(in_flight_, " requests in flight, ",
                                             WaitersAtOrAboveLocked(priority),
                                             " queued at this priority or above"));
  }
  ++in_flight_;
  ++counters_.admitted;
  return AdmissionTicket(this, priority, absl::ZeroDuration());
}

void AdmissionController::RemoveWaiterLocked(Waiter* w) {
  auto& q = queues_[static_cast<int>(w->priority)];
  q.erase(std::remove(q.begin(), q.end(), w), q.end());
}

absl::StatusOr<AdmissionTicket> AdmissionController::Admit(Priority priority, absl::Time deadline,
                                                           const std::atomic<bool>* cancelled) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  if (draining_) return DrainingLocked();
  if (CanAdmitNowLocked(priority)) {
    ++in_flight_;
    ++counters_.admitted;
    return AdmissionTicket(this, priority, absl::ZeroDuration());
  }
  auto& queue = queues_[static_cast<int>(priority)];
  if (static_cast<int>(queue.size()) >= options_.max_queued_per_priority) {
    return FullLocked(priority,
                      absl::StrCat(queue.size(), " requests of priority ",
                                   std::string(PriorityName(priority)), " are queued already"));
  }
  Waiter w{priority};
  queue.push_back(&w);
  while (!w.granted && !w.refused) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      RemoveWaiterLocked(&w);
      ++counters_.timed_out;
      return absl::DeadlineExceededError(absl::StrCat("the deadline passed after ",
                                                      absl::FormatDuration(now - start),
                                                      " in the router's admission queue"));
    }
    if (cancelled != nullptr && cancelled->load(std::memory_order_acquire)) {
      RemoveWaiterLocked(&w);
      ++counters_.timed_out;
      return absl::CancelledError("cancelled while queued for admission");
    }
    const absl::Time wake =
        cancelled != nullptr ? std::min(deadline, now + options_.cancel_poll) : deadline;
    w.cv.WaitWithDeadline(&mu_, wake);
  }
  if (w.refused) return DrainingLocked();
  ++counters_.admitted;
  return AdmissionTicket(this, priority, absl::Now() - start);
}

void AdmissionController::EndAsyncWaitLocked(Waiter* w, absl::StatusOr<AdmissionTicket> result,
                                             PendingCallbacks* out) {
  auto it = async_waiters_.find(w->wait_id);
  if (it == async_waiters_.end()) return;
  std::unique_ptr<Waiter> owned = std::move(it->second);
  async_waiters_.erase(it);
  out->emplace_back(std::move(owned->done), std::move(result));
}

uint64_t AdmissionController::AdmitAsync(Priority priority, absl::Time deadline,
                                         AdmitCallback done) {
  absl::StatusOr<AdmissionTicket> now_result = absl::UnknownError("unset");
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      now_result = DrainingLocked();
    } else if (CanAdmitNowLocked(priority)) {
      ++in_flight_;
      ++counters_.admitted;
      now_result = AdmissionTicket(this, priority, absl::ZeroDuration());
    } else if (static_cast<int>(queues_[static_cast<int>(priority)].size()) >=
               options_.max_queued_per_priority) {
      now_result = FullLocked(
          priority,
          absl::StrCat(queues_[static_cast<int>(priority)].size(), " requests of priority ",
                       std::string(PriorityName(priority)), " are queued already"));
    } else if (absl::Now() >= deadline) {
      ++counters_.timed_out;
      now_result = absl::DeadlineExceededError(
          "the deadline passed before the request could wait in the router's admission queue");
    } else {
      auto w = std::make_unique<Waiter>();
      w->priority = priority;
      w->wait_id = next_wait_id_++;
      w->done = std::move(done);
      w->deadline = deadline;
      w->start = absl::Now();
      const uint64_t id = w->wait_id;
      queues_[static_cast<int>(priority)].push_back(w.get());
      async_waiters_[id] = std::move(w);
      if (!deadline_thread_.joinable()) {
        deadline_thread_ = std::thread([this] { DeadlineLoop(); });
      }
      deadline_cv_.Signal();  // the earliest deadline may have changed
      return id;
    }
  }
  PendingCallbacks callbacks;
  callbacks.emplace_back(std::move(done), std::move(now_result));
  RunCallbacks(callbacks);
  return 0;
}

bool AdmissionController::CancelWait(uint64_t wait_id) {
  PendingCallbacks callbacks;
  {
    absl::MutexLock lock(&mu_);
    auto it = async_waiters_.find(wait_id);
    if (it == async_waiters_.end()) return false;
    RemoveWaiterLocked(it->second.get());
    ++counters_.timed_out;
    EndAsyncWaitLocked(it->second.get(),
                       absl::CancelledError("cancelled while queued for admission"), &callbacks);
  }
  RunCallbacks(callbacks);
  return true;
}

void AdmissionController::DeadlineLoop() {
  PendingCallbacks callbacks;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // End the waits whose deadline passed; find the next deadline. The
    // queues are bounded (max_queued_per_priority per class), so a scan is
    // cheap next to the wait it ends.
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    std::vector<Waiter*> expired;
    for (const auto& [id, w] : async_waiters_) {
      if (w->deadline <= now) {
        expired.push_back(w.get());
      } else {
        next = std::min(next, w->deadline);
      }
    }
    for (Waiter* w : expired) {
      RemoveWaiterLocked(w);
      ++counters_.timed_out;
      const absl::Duration waited = now - w->start;
      EndAsyncWaitLocked(w,
                         absl::DeadlineExceededError(absl::StrCat(
                             "the deadline passed after ", absl::FormatDuration(waited),
                             " in the router's admission queue")),
                         &callbacks);
    }
    if (!callbacks.empty()) {
      mu_.Unlock();
      RunCallbacks(callbacks);
      mu_.Lock();
      continue;  // the set changed while unlocked: look again
    }
    deadline_cv_.WaitWithDeadline(&mu_, next);
  }
}

void AdmissionController::ReleaseSlot() {
  PendingCallbacks callbacks;
  ReleaseSlotAndCollect(&callbacks);
  RunCallbacks(callbacks);
}

void AdmissionController::ReleaseSlotAndCollect(PendingCallbacks* callbacks) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  const absl::Time now = clock_->Now();
  completions_.push_back(now);
  // Bounded even with a clock that never moves.
  while (completions_.size() > 65536) completions_.pop_front();
  // Hand the slot over: highest class first, FIFO within a class.
  for (int p = kNumPriorities - 1; p >= 0 && in_flight_ < std::max(1, options_.max_in_flight);) {
    if (queues_[p].empty()) {
      --p;
      continue;
    }
    Waiter* w = queues_[p].front();
    queues_[p].pop_front();
    w->granted = true;
    ++in_flight_;
    if (w->wait_id != 0) {
      ++counters_.admitted;
      EndAsyncWaitLocked(w, AdmissionTicket(this, w->priority, absl::Now() - w->start), callbacks);
    } else {
      w->cv.Signal();
    }
  }
}

void AdmissionController::StartDrain() {
  PendingCallbacks callbacks;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    for (auto& q : queues_) {
      for (Waiter* w : q) {
        w->refused = true;
        if (w->wait_id != 0) {
          EndAsyncWaitLocked(w, DrainingLocked(), &callbacks);
        } else {
          w->cv.Signal();
        }
      }
      q.clear();
    }
  }
  RunCallbacks(callbacks);
}

bool AdmissionController::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool AdmissionController::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

AdmissionStats AdmissionController::Stats() const {
  absl::MutexLock lock(&mu_);
  AdmissionStats s = counters_;
  s.in_flight = in_flight_;
  for (int p = 0; p < kNumPriorities; ++p) s.queued[p] = static_cast<int>(queues_[p].size());
  s.completions_per_second = CompletionRateLocked(clock_->Now());
  return s;
}

}  // namespace tessera::router
