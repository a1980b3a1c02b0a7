#include "router/router.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::router {
namespace {

RouterOptions Normalize(RouterOptions options) {
  options.index.max_workers = options.registry.max_workers;
  if (options.default_block_size <= 0) options.default_block_size = 16;
  return options;
}

uint64_t InitialSeed(uint64_t seed, const Clock* clock) {
  if (seed != 0) return seed;
  return static_cast<uint64_t>(absl::ToUnixNanos(clock->Now())) ^ 0x5DEECE66DULL;
}

// The first stored event whose hashes disagree with the router's, if any.
absl::Status VerifyEvents(const HashScheme& scheme, absl::Span<const BlockEvent> events) {
  for (const BlockEvent& e : events) {
    if (e.kind != BlockEvent::Kind::kStored) continue;
    absl::Status s = VerifyStoredBlocks(scheme, e.parent_hash, e.block_hashes, e.token_ids);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

// Per-thread buffers of Route, reused so that a decision allocates little.
struct Router::Scratch {
  struct HashGroup {
    HashScheme scheme;
    std::vector<uint64_t> hashes;
  };
  std::vector<WorkerView> views;
  std::vector<Candidate> candidates;
  std::vector<size_t> view_of;  // candidate -> index into views
  std::vector<int> group_of;    // candidate -> hash group
  std::vector<HashGroup> groups;
  size_t num_groups = 0;
  std::vector<double> costs;
  std::vector<int32_t> matched;
  SlotSet among;
  size_t chosen = 0;  // candidate
};

Router::Router(RouterOptions options, const Clock* clock)
    : options_(Normalize(std::move(options))),
      clock_(clock),
      registry_(options_.registry, options_.default_block_size, clock),
      index_(options_.index, clock),
      rng_(InitialSeed(options_.rng_seed, clock)),
      affinity_(options_.policy.affinity.max_keys, options_.policy.affinity.ttl) {}

// --- Membership ----------------------------------------------------------------

absl::Status Router::AddWorker(std::string_view id) {
  absl::MutexLock lock(&membership_mu_);
  absl::StatusOr<WorkerRef> ref = registry_.Add(id);
  if (!ref.ok()) return ref.status();
  index_.ResetSlot(ref->slot, ref->incarnation);
  return absl::OkStatus();
}

bool Router::RemoveWorker(std::string_view id) {
  absl::MutexLock lock(&membership_mu_);
  std::optional<WorkerRef> ref = registry_.Remove(id);
  if (!ref.has_value()) return false;
  index_.ResetSlot(ref->slot, 0);
  absl::MutexLock l(&untrusted_mu_);
  untrusted_events_.erase(ref->incarnation);
  return true;
}

ReconcileResult Router::Reconcile(const std::vector<std::string>& addresses) {
  absl::MutexLock lock(&membership_mu_);
  ReconcileResult result = registry_.Reconcile(addresses);
  // Removed first: an added worker may have taken a removed one's slot.
  for (const auto& [id, ref] : result.removed) {
    index_.ResetSlot(ref.slot, 0);
    absl::MutexLock l(&untrusted_mu_);
    untrusted_events_.erase(ref.incarnation);
  }
  for (const auto& [id, ref] : result.added) index_.ResetSlot(ref.slot, ref.incarnation);
  return result;
}

// --- Feeding -------------------------------------------------------------------

absl::Status Router::SetWorkerInfo(std::string_view id, const WorkerStaticInfo& info) {
  absl::Status s = registry_.SetInfo(id, info);
  if (!s.ok()) return s;
  std::optional<WorkerRef> ref = registry_.Find(id);
  if (ref.has_value()) index_.SetCapacity(ref->slot, ref->incarnation, info.kv_blocks_total);
  return absl::OkStatus();
}

absl::Status Router::SetHealth(std::string_view id, HealthState state) {
  return registry_.SetHealth(id, state);
}

void Router::RecordSuccess(std::string_view id) { registry_.RecordSuccess(id); }

void Router::RecordFailure(std::string_view id) { registry_.RecordFailure(id); }

absl::Status Router::ApplyLoadReport(std::string_view id, const LoadReportView& report) {
  absl::StatusOr<LoadReportResult> r =
      registry_.ReportLoad(id, report.load, report.sequence, report.events_reset);
  if (!r.ok()) return r.status();
  const WorkerRef ref = r->ref;
  // Expired predictions go here, on the feeder's thread, rather than in a
  // route decision's Match.
  index_.PrunePredictions(ref.slot, ref.incarnation);

  if (!report.events_reset) {
    absl::MutexLock lock(&untrusted_mu_);
    // Already reported; the worker is routed on predictions until a
    // snapshot verifies.
    if (untrusted_events_.contains(ref.incarnation)) return absl::OkStatus();
  }
  absl::Status verified = VerifyEvents(r->scheme, report.events);
  if (!verified.ok()) {
    {
      absl::MutexLock lock(&untrusted_mu_);
      untrusted_events_.insert(ref.incarnation);
    }
    index_.FallBackToApproximate(ref.slot, ref.incarnation);
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", std::string(id),
        ": prefix-cache events ignored until its next snapshot: ", verified.message()));
  }
  if (report.events_reset) {
    {
      absl::MutexLock lock(&untrusted_mu_);
      untrusted_events_.erase(ref.incarnation);
    }
    index_.ApplyEvents(ref.slot, ref.incarnation, /*reset=*/true, report.events);
    return absl::OkStatus();
  }
  const bool exact = index_.Stats(ref.slot).mode == IndexMode::kExact;
  if (!report.events.empty() &&
      !index_.ApplyEvents(ref.slot, ref.incarnation, /*reset=*/false, report.events)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", std::string(id),
                     " sent prefix-cache events before a snapshot; they are ignored: "
                     "subscribe to WatchLoad with include_snapshot"));
  }
  if (r->sequence_gap && exact) {
    return absl::DataLossError(absl::StrCat(
        "worker ", std::string(id), ": load report ", report.sequence,
        " does not follow the previous one, so prefix-cache events were lost; resubscribe to "
        "WatchLoad with include_snapshot"));
  }
  return absl::OkStatus();
}

// --- Routing -------------------------------------------------------------------

absl::StatusOr<RouteDecision> Router::Route(const RouteRequest& request) {
  // A worker removed between the snapshot and the end of the decision makes
  // the decision void; the next snapshot no longer has it.
  constexpr int kAttempts = 4;
  absl::StatusOr<RouteDecision> decision;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    decision = RouteOnce(request);
    if (decision.ok() || !absl::IsAborted(decision.status())) return decision;
  }
  return absl::UnavailableError(
      "no worker could be chosen: workers kept leaving while the request was routed");
}

absl::StatusOr<RouteDecision> Router::RouteOnce(const RouteRequest& request) {
  static thread_local Scratch scratch;
  Scratch& s = scratch;
  registry_.Snapshot(&s.views, request.exclude);
  const int64_t prompt_tokens = request.prompt_tokens >= 0
                                    ? request.prompt_tokens
                                    : static_cast<int64_t>(request.token_ids.size());

  // Candidates: routable and not excluded.
  s.candidates.clear();
  s.view_of.clear();
  int unroutable[8] = {};
  int excluded = 0;
  for (size_t i = 0; i < s.views.size(); ++i) {
    const WorkerView& v = s.views[i];
    if (v.unroutable != Unroutable::kNone) {
      ++unroutable[static_cast<int>(v.unroutable)];
      continue;
    }
    if (v.excluded) {
      ++excluded;
      continue;
    }
    Candidate c;
    c.slot = v.ref.slot;
    c.in_flight = v.in_flight;
    if (v.load_known) {
      c.running = v.load.running_requests;
      c.waiting = v.load.waiting_requests + v.pending_requests;
      c.queued_prefill_tokens = v.load.waiting_prefill_tokens + v.pending_prefill_tokens;
      if (v.load.kv_blocks_total > 0) {
        c.kv_utilization = static_cast<double>(v.load.kv_blocks_used) /
                           static_cast<double>(v.load.kv_blocks_total);
      }
    } else {
      // No report yet: the router's own count is all there is.
      c.running = v.in_flight;
    }
    s.candidates.push_back(c);
    s.view_of.push_back(i);
  }
  if (s.candidates.empty()) {
    std::string why;
    for (int r = 1; r < 8; ++r) {
      if (unroutable[r] == 0) continue;
      absl::StrAppend(&why, why.empty() ? "" : ", ", unroutable[r], " ",
                      std::string(UnroutableName(static_cast<Unroutable>(r))));
    }
    if (excluded > 0) {
      absl::StrAppend(&why, why.empty() ? "" : ", ", excluded, " already tried");
    }
    return absl::UnavailableError(absl::StrCat("no worker can take the request (", s.views.size(),
                                               " registered", why.empty() ? "" : ": ", why, ")"));
  }

  // Prefix matches, one pass per hash scheme among the candidates.
  s.group_of.assign(s.candidates.size(), -1);
  s.num_groups = 0;
  if (s.among.capacity() < options_.registry.max_workers) {
    s.among = SlotSet(options_.registry.max_workers);
  }
  for (size_t i = 0; i < s.candidates.size(); ++i) {
    if (s.group_of[i] >= 0) continue;
    const WorkerView& v = s.views[s.view_of[i]];
    HashScheme scheme;
    scheme.block_size = v.info_known && v.info.kv_block_size > 0 ? v.info.kv_block_size
                                                                 : options_.default_block_size;
    scheme.seed = v.info_known ? v.info.prefix_hash_seed : 0;
    const int g = static_cast<int>(s.num_groups++);
    if (s.groups.size() < s.num_groups) s.groups.resize(s.num_groups);
    Scratch::HashGroup& group = s.groups[g];
    group.scheme = scheme;
    if (!request.block_hashes.empty() && request.hashes_scheme == scheme) {
      group.hashes.assign(request.block_hashes.begin(), request.block_hashes.end());
    } else if (!request.token_ids.empty()) {
      ComputeBlockHashes(request.token_ids, scheme, &group.hashes);
    } else {
      group.hashes.clear();
    }
    s.among.ClearAll();
    for (size_t j = i; j < s.candidates.size(); ++j) {
      if (s.group_of[j] >= 0) continue;
      const WorkerView& w = s.views[s.view_of[j]];
      const int bs = w.info_known && w.info.kv_block_size > 0 ? w.info.kv_block_size
                                                              : options_.default_block_size;
      const uint64_t seed = w.info_known ? w.info.prefix_hash_seed : 0;
      if (bs != scheme.block_size || seed != scheme.seed) continue;
      s.group_of[j] = g;
      s.among.Set(s.candidates[j].slot);
    }
    if (group.hashes.empty()) continue;
    index_.Match(group.hashes, s.among, &s.matched);
    // The worker recomputes at least the last prompt token, so a fully
    // cached prompt still prefills its last block.
    const int64_t usable_blocks = prompt_tokens > 0 ? (prompt_tokens - 1) / scheme.block_size : 0;
    for (size_t j = i; j < s.candidates.size(); ++j) {
      if (s.group_of[j] != g) continue;
      const int64_t blocks = std::min<int64_t>(s.matched[s.candidates[j].slot], usable_blocks);
      s.candidates[j].cached_tokens = blocks * scheme.block_size;
    }
  }

  // Costs need no lock; the policy's shared state (affinity table, random
  // numbers, round-robin position) does.
  if (options_.policy.kind == PolicyKind::kCost) {
    s.costs.resize(s.candidates.size());
    for (size_t i = 0; i < s.candidates.size(); ++i) {
      s.costs[i] = Cost(options_.policy.weights, s.candidates[i], prompt_tokens, request.priority);
    }
  }
  RouteDecision decision;
  {
    absl::MutexLock lock(&mu_);
    ChooseLocked(request, s, &decision);
  }
  FillDecision(request, prompt_tokens, s, &decision);
  std::optional<std::string> id = registry_.IdOf(decision.worker);
  if (!id.has_value()) return absl::AbortedError("the chosen worker was removed");
  decision.worker_id = std::move(*id);
  return decision;
}

void Router::ChooseLocked(const RouteRequest& request, Scratch& s, RouteDecision* decision) {
  const PolicyOptions& policy = options_.policy;
  const size_t n = s.candidates.size();
  size_t chosen = 0;
  switch (policy.kind) {
    case PolicyKind::kCost: {
      double best = 0;
      for (size_t i = 0; i < n; ++i) best = i == 0 ? s.costs[i] : std::min(best, s.costs[i]);
      bool sticky_chosen = false;
      if (policy.affinity.enabled && !request.routing_key.empty()) {
        std::optional<WorkerRef> bound = affinity_.Lookup(request.routing_key, clock_->Now());
        if (bound.has_value()) {
          for (size_t i = 0; i < n; ++i) {
            if (!(s.views[s.view_of[i]].ref == *bound)) continue;
            if (s.costs[i] <=
                policy.affinity.overload_factor * best + policy.affinity.overload_slack) {
              chosen = i;
              sticky_chosen = true;
            }
            break;
          }
        }
      }
      if (sticky_chosen) {
        decision->reason = RouteReason::kAffinity;
      } else {
        chosen = ChooseByCost(s.candidates, s.costs, policy, &rng_);
        decision->reason = RouteReason::kCost;
      }
      decision->cost = s.costs[chosen];
      break;
    }
    case PolicyKind::kRoundRobin:
      chosen = ChooseRoundRobin(s.candidates, &rr_last_slot_);
      decision->reason = RouteReason::kRoundRobin;
      break;
    case PolicyKind::kLeastLoaded:
      chosen = ChooseLeastLoaded(s.candidates, &rng_);
      decision->reason = RouteReason::kLeastLoaded;
      break;
  }
  s.chosen = chosen;
}

void Router::FillDecision(const RouteRequest& request, int64_t prompt_tokens, const Scratch& s,
                          RouteDecision* decision) const {
  const PolicyOptions& policy = options_.policy;
  const size_t n = s.candidates.size();
  const size_t chosen = s.chosen;
  const WorkerView& v = s.views[s.view_of[chosen]];
  decision->worker = v.ref;
  decision->probe = v.half_open;
  decision->prompt_tokens = prompt_tokens;
  decision->cached_tokens = s.candidates[chosen].cached_tokens;
  decision->candidates = static_cast<int>(n);
  if (policy.kind == PolicyKind::kCost && policy.affinity.enabled) {
    decision->routing_key = std::string(request.routing_key);
  }
  const Scratch::HashGroup& group = s.groups[s.group_of[chosen]];
  decision->scheme = group.scheme;
  decision->block_hashes = group.hashes;
}

namespace {
int64_t Uncached(const RouteDecision& d) {
  return std::max<int64_t>(0, d.prompt_tokens - d.cached_tokens);
}
}  // namespace

bool Router::OnAssigned(RouteDecision* decision) {
  if (!registry_.OnAssigned(decision->worker, Uncached(*decision), decision->probe,
                            &decision->assigned_epoch)) {
    return false;
  }
  index_.RecordRouted(decision->worker.slot, decision->worker.incarnation, decision->block_hashes);
  if (!decision->routing_key.empty()) {
    absl::MutexLock lock(&mu_);
    affinity_.Bind(decision->routing_key, decision->worker, clock_->Now());
  }
  return true;
}

absl::StatusOr<RouteDecision> Router::RouteAndAssign(const RouteRequest& request) {
  constexpr int kAttempts = 4;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    absl::StatusOr<RouteDecision> decision = Route(request);
    if (!decision.ok()) return decision.status();
    if (OnAssigned(&*decision)) return decision;
  }
  return absl::UnavailableError(
      "no worker could be assigned: workers kept changing state while the request was routed");
}

void Router::OnFinished(const RouteDecision& decision) {
  registry_.OnFinished(decision.worker, decision.probe, decision.assigned_epoch,
                       Uncached(decision));
}

std::vector<WorkerReport> Router::Report() const {
  std::vector<WorkerReport> out;
  for (WorkerStatus& status : registry_.Status()) {
    WorkerReport r;
    r.index = index_.Stats(status.ref.slot);
    r.status = std::move(status);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tessera::router
