#include "router/worker_registry.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::router {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::string_view HealthStateName(HealthState state) {
  switch (state) {
    case HealthState::kUnknown:
      return "unknown";
    case HealthState::kServing:
      return "serving";
    case HealthState::kNotServing:
      return "not_serving";
  }
  return "unknown";
}

std::string_view BreakerStateName(BreakerState state) {
  switch (state) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half_open";
  }
  return "closed";
}

std::string_view UnroutableName(Unroutable reason) {
  switch (reason) {
    case Unroutable::kNone:
      return "routable";
    case Unroutable::kHealthUnknown:
      return "health_unknown";
    case Unroutable::kNotServing:
      return "not_serving";
    case Unroutable::kDraining:
      return "draining";
    case Unroutable::kEjected:
      return "ejected";
    case Unroutable::kProbeInFlight:
      return "probe_in_flight";
    case Unroutable::kStale:
      return "stale";
  }
  return "routable";
}

struct WorkerRegistry::Entry {
  std::string id;
  WorkerRef ref;
  absl::Time added_at;

  bool info_known = false;
  WorkerStaticInfo info;
  HealthState health = HealthState::kUnknown;
  bool load_known = false;
  WorkerLoad load;
  uint64_t last_sequence = 0;

  // Circuit breaker. `breaker` is the state last stored; EffectiveBreaker
  // gives the state now (kOpen is kHalfOpen once ejected_until has passed).
  BreakerState breaker = BreakerState::kClosed;
  int consecutive_failures = 0;
  int ejections_in_row = 0;
  absl::Time ejected_until = absl::InfinitePast();
  bool probe_in_flight = false;

  uint64_t assigned_total = 0;
  uint64_t failures_total = 0;
  uint64_t ejections_total = 0;
};

// A slot's fast-changing numbers. Written under mu_ (so read-modify-write
// sequences stay consistent), read by Snapshot without it.
struct WorkerRegistry::Counters {
  std::atomic<uint64_t> incarnation{0};  // whose numbers these are
  std::atomic<int32_t> in_flight{0};
  std::atomic<int32_t> pending_requests{0};
  std::atomic<int64_t> pending_prefill_tokens{0};
  std::atomic<uint64_t> report_epoch{0};  // load reports received
  std::atomic<int64_t> last_heard_ns{0};
};

// What Snapshot and IdOf read: copies of the entries, in slot order.
struct WorkerRegistry::Published {
  std::vector<Entry> entries;
  std::vector<int32_t> at_slot;  // slot -> index into entries, -1 if free
};

namespace {
int64_t Nanos(absl::Time t) { return absl::ToUnixNanos(t); }
}  // namespace

WorkerRegistry::WorkerRegistry(RegistryOptions options, int default_block_size, const Clock* clock)
    : options_(std::move(options)),
      default_block_size_(default_block_size > 0 ? default_block_size : 16),
      clock_(clock) {
  slots_.resize(static_cast<size_t>(std::max(1, options_.max_workers)));
  counters_.reset(new Counters[slots_.size()]);
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

void WorkerRegistry::PublishLocked() {
  auto p = std::make_shared<Published>();
  p->entries.reserve(slot_of_.size());
  p->at_slot.assign(slots_.size(), -1);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i] == nullptr) continue;
    p->at_slot[i] = static_cast<int32_t>(p->entries.size());
    p->entries.push_back(*slots_[i]);
  }
  published_.store(std::shared_ptr<const Published>(std::move(p)), std::memory_order_release);
}

absl::Time WorkerRegistry::LastHeard(const Entry& e) const {
  const Counters& c = counters_[e.ref.slot];
  const int64_t ns = c.last_heard_ns.load(std::memory_order_relaxed);
  // A slot taken over meanwhile: the entry's own time is all there is.
  if (c.incarnation.load(std::memory_order_acquire) != e.ref.incarnation) return e.added_at;
  return absl::FromUnixNanos(ns);
}

WorkerRegistry::~WorkerRegistry() = default;

WorkerRegistry::Entry* WorkerRegistry::FindLocked(std::string_view id) const {
  auto it = slot_of_.find(ToAbsl(id));
  if (it == slot_of_.end()) return nullptr;
  return slots_[it->second].get();
}

WorkerRegistry::Entry* WorkerRegistry::FindLocked(const WorkerRef& ref) const {
  if (ref.slot < 0 || ref.slot >= static_cast<int>(slots_.size())) return nullptr;
  Entry* e = slots_[ref.slot].get();
  if (e == nullptr || e->ref.incarnation != ref.incarnation) return nullptr;
  return e;
}

absl::StatusOr<WorkerRef> WorkerRegistry::AddLocked(std::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("a worker address must not be empty");
  if (FindLocked(id) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("worker ", std::string(id), " is registered"));
  }
  auto free_slot = std::find(slots_.begin(), slots_.end(), nullptr);
  if (free_slot == slots_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot add worker ", std::string(id), ": all ", slots_.size(), " worker slots are taken"));
  }
  auto e = std::make_unique<Entry>();
  e->id = std::string(id);
  e->ref.slot = static_cast<int>(free_slot - slots_.begin());
  e->ref.incarnation = next_incarnation_++;
  e->added_at = clock_->Now();
  const WorkerRef ref = e->ref;
  Counters& c = counters_[ref.slot];
  c.in_flight.store(0, std::memory_order_relaxed);
  c.pending_requests.store(0, std::memory_order_relaxed);
  c.pending_prefill_tokens.store(0, std::memory_order_relaxed);
  c.report_epoch.store(0, std::memory_order_relaxed);
  c.last_heard_ns.store(Nanos(e->added_at), std::memory_order_relaxed);
  c.incarnation.store(ref.incarnation, std::memory_order_release);
  slot_of_.emplace(std::string(id), ref.slot);
  *free_slot = std::move(e);
  return ref;
}

std::optional<WorkerRef> WorkerRegistry::RemoveLocked(std::string_view id) {
  auto it = slot_of_.find(ToAbsl(id));
  if (it == slot_of_.end()) return std::nullopt;
  const int slot = it->second;
  const WorkerRef ref = slots_[slot]->ref;
  slots_[slot].reset();
  slot_of_.erase(it);
  return ref;
}

absl::StatusOr<WorkerRef> WorkerRegistry::Add(std::string_view id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<WorkerRef> ref = AddLocked(id);
  if (ref.ok()) PublishLocked();
  return ref;
}

std::optional<WorkerRef> WorkerRegistry::Remove(std::string_view id) {
  absl::MutexLock lock(&mu_);
  std::optional<WorkerRef> ref = RemoveLocked(id);
  if (ref.has_value()) PublishLocked();
  return ref;
}

ReconcileResult WorkerRegistry::Reconcile(const std::vector<std::string>& addresses) {
  ReconcileResult result;
  absl::flat_hash_set<std::string> wanted(addresses.begin(), addresses.end());
  absl::MutexLock lock(&mu_);
  std::vector<std::string> gone;
  for (const auto& [id, slot] : slot_of_) {
    if (!wanted.contains(id)) gone.push_back(id);
  }
  std::sort(gone.begin(), gone.end());
  for (const std::string& id : gone) {
    std::optional<WorkerRef> ref = RemoveLocked(id);
    if (ref.has_value()) result.removed.emplace_back(id, *ref);
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& id : addresses) {
    if (!seen.insert(id).second || FindLocked(id) != nullptr) continue;
    absl::StatusOr<WorkerRef> ref = AddLocked(id);
    if (ref.ok()) {
      result.added.emplace_back(id, *ref);
    } else {
      result.rejected.emplace_back(id, ref.status());
    }
  }
  if (!result.added.empty() || !result.removed.empty()) PublishLocked();
  return result;
}

std::optional<WorkerRef> WorkerRegistry::Find(std::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return std::nullopt;
  return e->ref;
}

size_t WorkerRegistry::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return slot_of_.size();
}

absl::Status WorkerRegistry::SetInfo(std::string_view id, const WorkerStaticInfo& info) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("unknown worker ", std::string(id)));
  e->info = info;
  e->info_known = true;
  PublishLocked();
  return absl::OkStatus();
}

absl::Status WorkerRegistry::SetHealth(std::string_view id, HealthState state) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("unknown worker ", std::string(id)));
  e->health = state;
  counters_[e->ref.slot].last_heard_ns.store(Nanos(clock_->Now()), std::memory_order_relaxed);
  PublishLocked();
  return absl::OkStatus();
}

absl::StatusOr<LoadReportResult> WorkerRegistry::ReportLoad(std::string_view id,
                                                            const WorkerLoad& load,
                                                            uint64_t sequence, bool events_reset) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("unknown worker ", std::string(id)));
  LoadReportResult result;
  result.ref = e->ref;
  result.scheme.block_size =
      e->info_known && e->info.kv_block_size > 0 ? e->info.kv_block_size : default_block_size_;
  result.scheme.seed = e->info_known ? e->info.prefix_hash_seed : 0;
  result.sequence_gap = sequence != 0 && !events_reset && sequence != e->last_sequence + 1;
  if (sequence != 0) e->last_sequence = sequence;
  e->load = load;
  e->load_known = true;
  Counters& c = counters_[e->ref.slot];
  c.last_heard_ns.store(Nanos(clock_->Now()), std::memory_order_relaxed);
  c.report_epoch.fetch_add(1, std::memory_order_relaxed);
  c.pending_requests.store(0, std::memory_order_relaxed);
  c.pending_prefill_tokens.store(0, std::memory_order_relaxed);
  PublishLocked();
  return result;
}

BreakerState WorkerRegistry::EffectiveBreaker(const Entry& e, absl::Time now) {
  if (e.breaker == BreakerState::kOpen && now >= e.ejected_until) return BreakerState::kHalfOpen;
  return e.breaker;
}

void WorkerRegistry::UpdateBreakerLocked(Entry& e, absl::Time now) const {
  if (e.breaker == BreakerState::kOpen && now >= e.ejected_until) {
    e.breaker = BreakerState::kHalfOpen;
    e.probe_in_flight = false;
  }
}

bool WorkerRegistry::MayEjectLocked(absl::Time now) const {
  int ejected = 0;
  int total = 0;
  for (const auto& slot : slots_) {
    if (slot == nullptr) continue;
    ++total;
    if (EffectiveBreaker(*slot, now) == BreakerState::kOpen) ++ejected;
  }
  const int limit = std::max(1, total * std::clamp(options_.max_ejected_percent, 0, 100) / 100);
  return ejected < limit;
}

void WorkerRegistry::EjectLocked(Entry& e, absl::Time now) {
  ++e.ejections_in_row;
  ++e.ejections_total;
  const double factor =
      std::pow(std::max(1.0, options_.ejection_multiplier), e.ejections_in_row - 1);
  absl::Duration d = options_.base_ejection * factor;
  if (d > options_.max_ejection || factor > 1e9) d = options_.max_ejection;
  e.breaker = BreakerState::kOpen;
  e.ejected_until = now + d;
  e.probe_in_flight = false;
}

void WorkerRegistry::RecordSuccess(std::string_view id) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id);
  if (e == nullptr) return;
  const absl::Time now = clock_->Now();
  const BreakerState before = e->breaker;
  const bool probe_before = e->probe_in_flight;
  UpdateBreakerLocked(*e, now);
  counters_[e->ref.slot].last_heard_ns.store(Nanos(now), std::memory_order_relaxed);
  e->consecutive_failures = 0;
  if (e->breaker == BreakerState::kHalfOpen) {
    e->breaker = BreakerState::kClosed;
    e->ejections_in_row = 0;
    e->probe_in_flight = false;
  }
  // Decisions see the breaker, not the failure count: publish only when it
  // changed (a success is the common case, once per request).
  if (e->breaker != before || e->probe_in_flight != probe_before) PublishLocked();
}

void WorkerRegistry::RecordFailure(std::string_view id) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(id);
  if (e == nullptr) return;
  const absl::Time now = clock_->Now();
  UpdateBreakerLocked(*e, now);
  ++e->failures_total;
  ++e->consecutive_failures;
  switch (e->breaker) {
    case BreakerState::kClosed:
      if (e->consecutive_failures >= std::max(1, options_.failures_to_eject) &&
          MayEjectLocked(now)) {
        EjectLocked(*e, now);
      }
      break;
    case BreakerState::kHalfOpen:
      // The probe (or a late request) failed: back off further.
      EjectLocked(*e, now);
      break;
    case BreakerState::kOpen:
      // Requests sent before the ejection are still failing; the back-off
      // already runs.
      break;
  }
  PublishLocked();
}

Unroutable WorkerRegistry::UnroutableAt(const Entry& e, absl::Time last_heard,
                                        absl::Time now) const {
  // (A stored kOpen has no probe in flight: ejecting clears it.)
  const BreakerState breaker = EffectiveBreaker(e, now);
  if (breaker == BreakerState::kOpen) return Unroutable::kEjected;
  if (breaker == BreakerState::kHalfOpen && e.probe_in_flight) return Unroutable::kProbeInFlight;
  if (e.health == HealthState::kUnknown) return Unroutable::kHealthUnknown;
  if (e.health == HealthState::kNotServing) return Unroutable::kNotServing;
  if (e.load_known && e.load.draining) return Unroutable::kDraining;
  if (options_.load_staleness != absl::InfiniteDuration() &&
      now - last_heard > options_.load_staleness) {
    return Unroutable::kStale;
  }
  return Unroutable::kNone;
}

std::optional<std::string> WorkerRegistry::IdOf(const WorkerRef& ref) const {
  const std::shared_ptr<const Published> p = published_.load(std::memory_order_acquire);
  if (ref.slot < 0 || ref.slot >= static_cast<int>(p->at_slot.size())) return std::nullopt;
  const int32_t i = p->at_slot[ref.slot];
  if (i < 0 || p->entries[i].ref.incarnation != ref.incarnation) return std::nullopt;
  return p->entries[i].id;
}

void WorkerRegistry::Snapshot(std::vector<WorkerView>* out,
                              absl::Span<const std::string> exclude) const {
  const std::shared_ptr<const Published> p = published_.load(std::memory_order_acquire);
  const absl::Time now = clock_->Now();
  out->resize(p->entries.size());
  size_t n = 0;
  for (const Entry& e : p->entries) {
    WorkerView& v = (*out)[n++];
    const Counters& c = counters_[e.ref.slot];
    const bool own = c.incarnation.load(std::memory_order_acquire) == e.ref.incarnation;
    v.ref = e.ref;
    v.excluded =
        !exclude.empty() && std::find(exclude.begin(), exclude.end(), e.id) != exclude.end();
    v.unroutable = UnroutableAt(e, LastHeard(e), now);
    v.half_open = EffectiveBreaker(e, now) == BreakerState::kHalfOpen;
    v.info_known = e.info_known;
    v.info = e.info;
    v.load_known = e.load_known;
    v.load = e.load;
    v.in_flight = own ? c.in_flight.load(std::memory_order_relaxed) : 0;
    v.pending_requests = own ? c.pending_requests.load(std::memory_order_relaxed) : 0;
    v.pending_prefill_tokens = own ? c.pending_prefill_tokens.load(std::memory_order_relaxed) : 0;
  }
}

bool WorkerRegistry::OnAssigned(const WorkerRef& ref, int64_t prefill_tokens, bool probe,
                                uint64_t* epoch) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(ref);
  if (e == nullptr) return false;
  UpdateBreakerLocked(*e, clock_->Now());
  if (e->breaker == BreakerState::kOpen) return false;
  if (e->breaker == BreakerState::kHalfOpen) {
    // Only the probe may go to a half-open worker.
    if (!probe || e->probe_in_flight) return false;
    e->probe_in_flight = true;
    PublishLocked();
  }
  Counters& c = counters_[e->ref.slot];
  c.in_flight.fetch_add(1, std::memory_order_relaxed);
  c.pending_requests.fetch_add(1, std::memory_order_relaxed);
  c.pending_prefill_tokens.fetch_add(std::max<int64_t>(0, prefill_tokens),
                                     std::memory_order_relaxed);
  ++e->assigned_total;
  if (epoch != nullptr) *epoch = c.report_epoch.load(std::memory_order_relaxed);
  return true;
}

void WorkerRegistry::OnFinished(const WorkerRef& ref, bool probe, uint64_t epoch,
                                int64_t prefill_tokens) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(ref);
  if (e == nullptr) return;
  // Counters change only under mu_, so these read-modify-writes are not
  // raced by another writer.
  Counters& c = counters_[e->ref.slot];
  const int32_t in_flight = c.in_flight.load(std::memory_order_relaxed);
  if (in_flight > 0) c.in_flight.store(in_flight - 1, std::memory_order_relaxed);
  const int32_t pending = c.pending_requests.load(std::memory_order_relaxed);
  if (epoch == c.report_epoch.load(std::memory_order_relaxed) && pending > 0) {
    c.pending_requests.store(pending - 1, std::memory_order_relaxed);
    c.pending_prefill_tokens.store(
        std::max<int64_t>(0, c.pending_prefill_tokens.load(std::memory_order_relaxed) -
                                 std::max<int64_t>(0, prefill_tokens)),
        std::memory_order_relaxed);
  }
  // A probe that ended without a verdict (say, the client cancelled it)
  // frees the probe for the next request.
  if (probe && e->probe_in_flight) {
    e->probe_in_flight = false;
    PublishLocked();
  }
}

WorkerStatus WorkerRegistry::StatusLocked(const Entry& e, absl::Time now) const {
  WorkerStatus s;
  s.id = e.id;
  s.ref = e.ref;
  s.health = e.health;
  s.breaker = EffectiveBreaker(e, now);
  s.unroutable = UnroutableAt(e, LastHeard(e), now);
  s.consecutive_failures = e.consecutive_failures;
  s.ejected_until = e.ejected_until;
  s.load_known = e.load_known;
  s.load = e.load;
  s.last_heard = LastHeard(e);
  s.in_flight = counters_[e.ref.slot].in_flight.load(std::memory_order_relaxed);
  s.assigned_total = e.assigned_total;
  s.failures_total = e.failures_total;
  s.ejections_total = e.ejections_total;
  return s;
}

std::vector<WorkerStatus> WorkerRegistry::Status() const {
  absl::ReaderMutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<WorkerStatus> out;
  for (const auto& slot : slots_) {
    if (slot == nullptr) continue;
    out.push_back(StatusLocked(*slot, now));
  }
  return out;
}

std::optional<WorkerStatus> WorkerRegistry::StatusOf(std::string_view id) const {
  absl::ReaderMutexLock lock(&mu_);
  const Entry* e = FindLocked(id);
  if (e == nullptr) return std::nullopt;
  return StatusLocked(*e, clock_->Now());
}

}  // namespace tessera::router
