// Adaptive speculation: how many draft tokens to ask for, per sequence and
// step. It follows an exponential moving average of the sequence's accepted
// draft tokens per verification (asking for one more than it usually
// accepts) and shrinks as the batch grows, turning speculation off at
// `disable_batch_size` running decodes, where the target's forward pass is
// no longer memory-bound and verifying rejected tokens costs real compute.
// A sequence whose drafts keep failing (acceptance rate EMA below
// `min_acceptance_rate`) asks for none, probing with one token every
// `probe_interval` steps.
//
// Thread-safety: a plain value owned by one sequence's engine state.
#pragma once

#include <algorithm>
#include <cmath>

namespace tessera::spec {

struct SpeculationOptions {
  int num_speculative_tokens = 0;  // the most per step; 0 = speculation off
  bool adaptive = true;            // false = always num_speculative_tokens
  int disable_batch_size = 32;     // (adaptive) no drafts at this many decodes
  double ema_weight = 0.3;         // weight of the newest observation
  double min_acceptance_rate = 0.15;
  int probe_interval = 16;
};

class AdaptiveDraftLength {
 public:
  explicit AdaptiveDraftLength(const SpeculationOptions& o)
      : accepted_ema_(o.num_speculative_tokens), rate_ema_(1.0) {}

  int Next(const SpeculationOptions& o, int batch_decodes) {
    ++steps_;
    const int max_k = o.num_speculative_tokens;
    if (max_k <= 0) return 0;
    if (!o.adaptive) return max_k;
    if (batch_decodes >= o.disable_batch_size) return 0;
    if (rate_ema_ < o.min_acceptance_rate) return steps_ % o.probe_interval == 0 ? 1 : 0;
    int k = std::clamp(static_cast<int>(std::lround(accepted_ema_)) + 1, 1, max_k);
    const double room = 1.0 - static_cast<double>(batch_decodes) / o.disable_batch_size;
    return std::max(1, static_cast<int>(std::floor(k * room + 0.5)));
  }

  void Observe(const SpeculationOptions& o, int proposed, int accepted) {
    if (proposed <= 0) return;
    const double w = o.ema_weight;
    accepted_ema_ = (1 - w) * accepted_ema_ + w * accepted;
    rate_ema_ = (1 - w) * rate_ema_ + w * static_cast<double>(accepted) / proposed;
  }

  double accepted_ema() const { return accepted_ema_; }

 private:
  double accepted_ema_;
  double rate_ema_;
  long steps_ = 0;
};

}  // namespace tessera::spec
