// AdmissionController: how many requests the router works on at once, and
// who waits when it is full.
//
//   - At most `max_in_flight` requests hold a ticket (AdmissionTicket, an
//     RAII handle that gives its slot back when destroyed).
//   - A request that cannot start at once may wait in the queue of its
//     priority class (at most `max_queued_per_priority` waiters per class).
//     A freed slot goes to the oldest waiter of the highest non-empty class;
//     a newcomer never overtakes a waiter of its own or a higher class.
//     Strict priority: a steady stream of high-priority work can starve the
//     low class (by design; size the classes' traffic accordingly).
//   - A refusal is RESOURCE_EXHAUSTED with a retry-after hint: the time the
//     router needs, at its recent completion rate, to work through the
//     requests ahead of this one:
//         hint = (waiters of this or a higher class + 1) / completion rate
//     where the completion rate is the tickets released within `rate_window`
//     divided by the time since the oldest of them, clamped to
//     [min_retry_after, max_retry_after] (`default_retry_after` when fewer
//     than two completions are on record). The hint rides in the status
//     message and as a payload (RetryAfterFromStatus reads it), for the
//     adapter's "retry-after-ms" trailer.
//   - Drain mode refuses new requests with UNAVAILABLE and turns the waiters
//     away the same way, so clients go to another router replica; requests
//     already admitted run on (WaitIdle waits for them).
//   - Two ways to wait: Admit blocks the calling thread; AdmitAsync queues a
//     callback instead, for callers that must not hold a thread while they
//     wait (the router's callback-API stream handlers). Both kinds share the
//     same queues and order. An async waiter is told its outcome exactly
//     once: by the thread whose release frees the slot, by the controller's
//     one deadline thread (started with the first async waiter), by
//     StartDrain's caller, or by CancelWait's caller. Callbacks never run
//     under the controller's lock, so they may call back into it.
//
// Thread-safety: thread-safe. REQUIRES: the controller outlives its tickets
// and its waiters.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/clock.h"
#include "router/priority.h"

namespace tessera::router {

struct AdmissionOptions {
  int max_in_flight = 256;            // REQUIRES: >= 1
  int max_queued_per_priority = 256;  // 0: never wait, refuse at once
  absl::Duration rate_window = absl::Seconds(10);
  absl::Duration min_retry_after = absl::Milliseconds(50);
  absl::Duration max_retry_after = absl::Seconds(30);
  absl::Duration default_retry_after = absl::Seconds(1);
  // How often a waiter checks its `cancelled` flag.
  absl::Duration cancel_poll = absl::Milliseconds(20);
};

// The payload key under which refusals carry the retry hint (milliseconds,
// decimal text).
inline constexpr std::string_view kRetryAfterPayloadUrl = "type.tessera.dev/tessera.RetryAfterMs";

// The retry hint of a refusal, if it carries one.
std::optional<absl::Duration> RetryAfterFromStatus(const absl::Status& status);

class AdmissionController;
class AdmissionTicket;

// Receives the outcome of an AdmitAsync wait: a ticket, or the refusal
// (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE).
using AdmitCallback = std::function<void(absl::StatusOr<AdmissionTicket>)>;

// One admitted request's slot. Move-only; releasing (or destroying) it gives
// the slot to the next waiter and counts a completion.
class AdmissionTicket {
 public:
  AdmissionTicket() = default;
  ~AdmissionTicket() { Release(); }
  AdmissionTicket(AdmissionTicket&& other) noexcept { *this = std::move(other); }
  AdmissionTicket& operator=(AdmissionTicket&& other) noexcept;
  AdmissionTicket(const AdmissionTicket&) = delete;
  AdmissionTicket& operator=(const AdmissionTicket&) = delete;

  void Release();
  bool valid() const { return controller_ != nullptr; }
  Priority priority() const { return priority_; }
  // Time spent in the queue before admission (zero when admitted at once).
  absl::Duration queued() const { return queued_; }

 private:
  friend class AdmissionController;
  AdmissionTicket(AdmissionController* controller, Priority priority, absl::Duration queued)
      : controller_(controller), priority_(priority), queued_(queued) {}

  AdmissionController* controller_ = nullptr;
  Priority priority_ = Priority::kNormal;
  absl::Duration queued_;
};

struct AdmissionStats {
  int in_flight = 0;
  std::array<int, kNumPriorities> queued{};
  uint64_t admitted = 0;
  uint64_t refused_full = 0;      // RESOURCE_EXHAUSTED
  uint64_t refused_draining = 0;  // UNAVAILABLE
  uint64_t timed_out = 0;         // DEADLINE_EXCEEDED or CANCELLED while queued
  double completions_per_second = 0;
};

class AdmissionController {
 public:
  // REQUIRES: `clock` outlives the controller. The clock times completions
  // (for the rate); waiting uses real time.
  explicit AdmissionController(AdmissionOptions options, const Clock* clock = SystemClock::Get());
  // Stops the deadline thread. REQUIRES: no async waiter is queued.
  ~AdmissionController();
  AdmissionController(const AdmissionController&) = delete;
  AdmissionController& operator=(const AdmissionController&) = delete;

  // Admits at once or refuses: RESOURCE_EXHAUSTED (with a retry hint) when
  // every slot is taken or requests of this or a higher class are queued;
  // UNAVAILABLE when draining.
  absl::StatusOr<AdmissionTicket> TryAdmit(Priority priority);

  // Admits at once, or waits in the queue of its class until a slot is
  // handed over. RESOURCE_EXHAUSTED (with a retry hint) when that queue is
  // full; DEADLINE_EXCEEDED when `deadline` passes first; CANCELLED when
  // *cancelled turns true (checked every cancel_poll); UNAVAILABLE when
  // draining, or when draining starts while it waits.
  absl::StatusOr<AdmissionTicket> Admit(Priority priority, absl::Time deadline,
                                        const std::atomic<bool>* cancelled = nullptr);

  // The non-blocking form of Admit: the same decisions, told to `done`
  // exactly once. When the outcome is known at once (admitted, queue full,
  // draining, deadline already past), `done` runs on the calling thread
  // before AdmitAsync returns, and the result is 0. Otherwise the request
  // waits in its class's queue and the result is its wait id (> 0): `done`
  // then runs on the thread that releases the slot it gets, on the deadline
  // thread (DEADLINE_EXCEEDED), in StartDrain (UNAVAILABLE) or in CancelWait
  // (CANCELLED). No lock of the controller is held while `done` runs.
  // Callbacks that become ready while a thread is already running one (a
  // callback that releases a ticket hands the slot on) run on that thread
  // right after the current one returns, not nested inside it.
  // REQUIRES: `done` does not block for long (it runs on a releasing
  // thread) and is non-null.
  uint64_t AdmitAsync(Priority priority, absl::Time deadline, AdmitCallback done);

  // Takes the async waiter `wait_id` out of its queue and runs its callback
  // with CANCELLED on the calling thread (before returning, or right after
  // the admission callback this thread is running returns); returns true. Returns false when
  // the wait already ended (its callback has run, or is running on another
  // thread) or the id is unknown; then nothing happens here.
  bool CancelWait(uint64_t wait_id);

  // Refuses new requests from now on and turns the waiters away.
  void StartDrain();
  bool draining() const;
  // Waits until no ticket is held; false if `deadline` passed first.
  bool WaitIdle(absl::Time deadline);

  // The hint a refusal of `priority` would carry now.
  absl::Duration RetryAfter(Priority priority) const;
  AdmissionStats Stats() const;

 private:
  friend class AdmissionTicket;
  struct Waiter;

  void ReleaseSlot();
  void ReleaseSlotAndCollect(
      std::vector<std::pair<AdmitCallback, absl::StatusOr<AdmissionTicket>>>* callbacks);
  bool CanAdmitNowLocked(Priority priority) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int WaitersAtOrAboveLocked(Priority priority) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double CompletionRateLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration RetryAfterLocked(Priority priority) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FullLocked(Priority priority, std::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DrainingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWaiterLocked(Waiter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends async waiter `w` (already out of its queue) with `result`: hands
  // the callback over to be run after the lock is released.
  void EndAsyncWaitLocked(
      Waiter* w, absl::StatusOr<AdmissionTicket> result,
      std::vector<std::pair<AdmitCallback, absl::StatusOr<AdmissionTicket>>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeadlineLoop();

  const AdmissionOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::array<std::deque<Waiter*>, kNumPriorities> queues_ ABSL_GUARDED_BY(mu_);
  // Release times within rate_window, oldest first.
  mutable std::deque<absl::Time> completions_ ABSL_GUARDED_BY(mu_);
  AdmissionStats counters_ ABSL_GUARDED_BY(mu_);
  // Async waiters by wait id (they live here; the queues point at them).
  std::unordered_map<uint64_t, std::unique_ptr<Waiter>> async_waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The deadline thread sleeps on this until the earliest async deadline.
  absl::CondVar deadline_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread deadline_thread_;  // started with the first async waiter
};

}  // namespace tessera::router
