#include "services/common/sampling_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"

namespace tessera::services {

absl::Status CheckKnownSamplingFields(const tessera::v1::SamplingParams& w) {
  const google::protobuf::UnknownFieldSet& unknown = w.GetReflection()->GetUnknownFields(w);
  if (unknown.empty()) return absl::OkStatus();
  const int number = unknown.field(0).number();
  return absl::InvalidArgumentError(
      absl::StrCat("sampling has field number ", number, ", which this server does not know",
                   number == 15 ? " (min_tokens, which is not supported)" : "", "; remove it"));
}

absl::StatusOr<ConvertedSampling> ConvertSampling(const tessera::v1::SamplingParams& w,
                                                  int vocab_size, int max_tokens_limit,
                                                  uint64_t random_seed) {
  if (absl::Status s = CheckKnownSamplingFields(w); !s.ok()) return s;
  ConvertedSampling c;
  sampling::SamplingParams& p = c.params;
  if (w.has_temperature()) p.temperature = w.temperature();
  if (w.has_top_p()) p.top_p = w.top_p();
  if (w.has_top_k()) p.top_k = w.top_k();
  if (w.has_min_p()) p.min_p = w.min_p();
  if (w.has_repetition_penalty()) p.repetition_penalty = w.repetition_penalty();
  if (w.has_presence_penalty()) p.presence_penalty = w.presence_penalty();
  if (w.has_frequency_penalty()) p.frequency_penalty = w.frequency_penalty();
  p.seed = w.has_seed() ? w.seed() : random_seed;
  c.logprobs = w.has_logprobs() && w.logprobs();
  if (w.has_top_logprobs()) {
    if (!c.logprobs && w.top_logprobs() > 0) {
      return absl::InvalidArgumentError("top_logprobs needs logprobs = true");
    }
    p.top_logprobs = w.top_logprobs();
  }
  if (auto s = sampling::ValidateSamplingParams(p, vocab_size); !s.ok()) return s;
  if (max_tokens_limit < 1) {
    return absl::InvalidArgumentError("the prompt fills the model's context: no room for output");
  }
  if (w.has_max_tokens()) {
    if (w.max_tokens() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_tokens must be >= 1, got ", w.max_tokens()));
    }
    if (w.max_tokens() > max_tokens_limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_tokens is ", w.max_tokens(), " but the context leaves room for ",
                       max_tokens_limit, " tokens after this prompt"));
    }
    c.max_tokens = w.max_tokens();
  } else {
    c.max_tokens = std::min(kDefaultMaxTokens, max_tokens_limit);
  }
  c.ignore_eos = w.has_ignore_eos() && w.ignore_eos();
  for (int32_t id : w.stop_token_ids()) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids has ", id, ": ids must be in [0, ", vocab_size, ")"));
    }
    c.stop_token_ids.push_back(id);
  }
  return c;
}

}  // namespace tessera::services
