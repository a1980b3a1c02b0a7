// SamplingParams: how one sequence picks its next token, and the validation
// the gRPC layer and the engine share so a bad request is refused with the
// same message everywhere.
//
// Semantics follow vLLM / the OpenAI API (see sampler.h for the order in
// which they apply):
//   temperature         >= 0; below kGreedyTemperature (incl. 0) = greedy
//   top_k               0 or -1 = disabled; k > vocab_size acts as disabled
//   top_p               (0, 1]; 1 = disabled
//   min_p               [0, 1]; 0 = disabled
//   repetition_penalty  > 0; 1 = disabled (applies to prompt and output tokens)
//   presence_penalty    [-2, 2]; 0 = disabled (output tokens only)
//   frequency_penalty   [-2, 2]; 0 = disabled (output tokens only)
//   seed                key of the random stream; a caller that got no seed
//                       from the client picks one at random per request
//   top_logprobs        [0, kMaxTopLogprobs] alternatives to report
//
// Thread-safety: plain values; ValidateSamplingParams is pure.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace tessera::sampling {

// Temperatures below this are greedy (dividing logits by them would overflow).
inline constexpr float kGreedyTemperature = 1e-5f;
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr float kMaxAbsPresenceOrFrequencyPenalty = 2.0f;

struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t top_logprobs = 0;

  bool greedy() const { return temperature < kGreedyTemperature; }
};

// OK, or INVALID_ARGUMENT naming the first bad field, its valid range and
// the value given, e.g. "top_p must be in (0, 1], got 1.5". NaN and
// infinities are rejected for every float field.
absl::Status ValidateSamplingParams(const SamplingParams& params, int vocab_size);

}  // namespace tessera::sampling
