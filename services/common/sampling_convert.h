// Converts the wire SamplingParams (explicit presence: unset = default) into
// the engine's request fields, with the validation every service shares so
// a bad request gets the same precise INVALID_ARGUMENT everywhere.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "worker/sampling/sampling_params.h"

namespace tessera::services {

// Default max_tokens when a request leaves it unset (capped by the context).
inline constexpr int kDefaultMaxTokens = 256;

struct ConvertedSampling {
  sampling::SamplingParams params;
  int max_tokens = kDefaultMaxTokens;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  bool logprobs = false;
};

// OK unless `wire` carries fields this build does not know (a newer client,
// or a removed field such as min_tokens, number 15): those are an error
// naming the field number, never silently ignored.
absl::Status CheckKnownSamplingFields(const tessera::v1::SamplingParams& wire);

// `vocab_size` bounds stop_token_ids and top_k; `max_tokens_limit` is the
// largest max_tokens the model's context allows for this prompt (a larger
// explicit value is an error; an unset one is capped). `random_seed` is used
// when the request sets no seed.
absl::StatusOr<ConvertedSampling> ConvertSampling(const tessera::v1::SamplingParams& wire,
                                                  int vocab_size, int max_tokens_limit,
                                                  uint64_t random_seed);

}  // namespace tessera::services
