#include "router/policy.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera::router {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name) {
  if (name == "cost" || name == "cache_aware") return PolicyKind::kCost;
  if (name == "round_robin") return PolicyKind::kRoundRobin;
  if (name == "least_loaded") return PolicyKind::kLeastLoaded;
  return absl::InvalidArgumentError(absl::StrCat("unknown routing policy \"", std::string(name),
                                                 "\"; expected cost, round_robin or least_loaded"));
}

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kCost:
      return "cost";
    case PolicyKind::kRoundRobin:
      return "round_robin";
    case PolicyKind::kLeastLoaded:
      return "least_loaded";
  }
  return "cost";
}

std::string_view RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kCost:
      return "cost";
    case RouteReason::kAffinity:
      return "affinity";
    case RouteReason::kRoundRobin:
      return "round_robin";
    case RouteReason::kLeastLoaded:
      return "least_loaded";
  }
  return "cost";
}

double LoadCost(const CostWeights& w, const Candidate& c, Priority priority) {
  const double queue_factor = priority == Priority::kHigh ? w.high_priority_queue_factor : 1.0;
  double cost = queue_factor * (w.queued_prefill * static_cast<double>(c.queued_prefill_tokens) +
                                w.waiting * c.waiting) +
                w.running * c.running;
  if (w.kv_pressure_start < 1.0 && c.kv_utilization > w.kv_pressure_start) {
    const double over =
        (std::min(c.kv_utilization, 1.0) - w.kv_pressure_start) / (1.0 - w.kv_pressure_start);
    cost += w.kv_pressure * over;
  }
  return cost;
}

double Cost(const CostWeights& w, const Candidate& c, int64_t prompt_tokens, Priority priority) {
  const int64_t uncached = std::max<int64_t>(0, prompt_tokens - c.cached_tokens);
  return w.prefill * static_cast<double>(uncached) + LoadCost(w, c, priority);
}

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Uniform(uint64_t n) {
  // Lemire's multiply-shift; the bias (< n / 2^64) is irrelevant here.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
}

size_t ChooseByCost(absl::Span<const Candidate> candidates, absl::Span<const double> costs,
                    const PolicyOptions& options, SplitMix64* rng) {
  double best = std::numeric_limits<double>::infinity();
  for (double c : costs) best = std::min(best, c);
  const double tolerance =
      std::max(options.near_best_relative * std::max(best, 0.0), options.near_best_absolute);
  absl::InlinedVector<size_t, 64> near;
  for (size_t i = 0; i < costs.size(); ++i) {
    if (costs[i] <= best + tolerance) near.push_back(i);
  }
  if (near.size() == 1) return near[0];
  const size_t a = near[rng->Uniform(near.size())];
  size_t b = near[rng->Uniform(near.size() - 1)];
  if (b == a) b = near.back();
  if (costs[b] < costs[a]) return b;
  if (costs[b] == costs[a] && candidates[b].in_flight < candidates[a].in_flight) return b;
  return a;
}

size_t ChooseLeastLoaded(absl::Span<const Candidate> candidates, SplitMix64* rng) {
  int64_t best = std::numeric_limits<int64_t>::max();
  size_t chosen = 0;
  uint64_t ties = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int64_t load = int64_t{candidates[i].running} + candidates[i].waiting;
    if (load < best) {
      best = load;
      chosen = i;
      ties = 1;
    } else if (load == best) {
      // Reservoir sampling: each tied candidate is kept with equal chance.
      ++ties;
      if (rng->Uniform(ties) == 0) chosen = i;
    }
  }
  return chosen;
}

size_t ChooseRoundRobin(absl::Span<const Candidate> candidates, int* last_slot) {
  size_t chosen = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].slot > *last_slot) {
      chosen = i;
      break;
    }
  }
  *last_slot = candidates[chosen].slot;
  return chosen;
}

void AffinityTable::EvictExpired(absl::Time now) {
  while (!lru_.empty() && (now - lru_.back().used > ttl_ || map_.size() > max_keys_)) {
    map_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

std::optional<WorkerRef> AffinityTable::Lookup(std::string_view key, absl::Time now) {
  EvictExpired(now);
  auto it = map_.find(ToAbsl(key));
  if (it == map_.end()) return std::nullopt;
  return it->second->worker;
}

void AffinityTable::Bind(std::string_view key, const WorkerRef& worker, absl::Time now) {
  if (max_keys_ == 0) return;
  auto it = map_.find(ToAbsl(key));
  if (it != map_.end()) {
    it->second->worker = worker;
    it->second->used = now;
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    lru_.push_front(Item{std::string(key), worker, now});
    map_.emplace(lru_.front().key, lru_.begin());
  }
  EvictExpired(now);
}

void AffinityTable::Erase(std::string_view key) {
  auto it = map_.find(ToAbsl(key));
  if (it == map_.end()) return;
  lru_.erase(it->second);
  map_.erase(it);
}

}  // namespace tessera::router
