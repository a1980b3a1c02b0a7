#include "worker/sampling/sampling_params.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace tessera::sampling {
namespace {

// `value` keeps its type, so integers print as integers.
template <typename T>
absl::Status Bad(const char* field, const std::string& range, T value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be ", range, ", got ", value));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be positive, got ", vocab_size));
  }
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return Bad("temperature", "a finite number >= 0", p.temperature);
  }
  if (p.top_k < -1) {
    return Bad("top_k", "-1 or 0 (disabled) or a positive integer", p.top_k);
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) return Bad("top_p", "in (0, 1]", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) return Bad("min_p", "in [0, 1]", p.min_p);
  if (!std::isfinite(p.repetition_penalty) || !(p.repetition_penalty > 0)) {
    return Bad("repetition_penalty", "a finite number > 0", p.repetition_penalty);
  }
  if (!(std::fabs(p.presence_penalty) <= kMaxAbsPresenceOrFrequencyPenalty)) {
    return Bad("presence_penalty", "in [-2, 2]", p.presence_penalty);
  }
  if (!(std::fabs(p.frequency_penalty) <= kMaxAbsPresenceOrFrequencyPenalty)) {
    return Bad("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return Bad("top_logprobs", absl::StrCat("in [0, ", kMaxTopLogprobs, "]"), p.top_logprobs);
  }
  if (p.top_logprobs > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_logprobs must be at most the vocabulary size ", vocab_size, ", got ", p.top_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace tessera::sampling
