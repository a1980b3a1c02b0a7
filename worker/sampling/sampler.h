// The CPU sampler: one sequence's logits row + SamplingParams -> the next
// token, its log-probability and the top alternatives. It is the reference
// every other sampling backend is checked against.
//
// Order of processing (that of Hugging Face `generate` and the OpenAI/vLLM
// parameter semantics):
//   1. penalties, on the raw logits, in vLLM's order:
//        repetition (tokens seen in the prompt or the output):
//            logit > 0 ? logit / r : logit * r
//        frequency  (output tokens):  logit -= frequency_penalty * count
//        presence   (output tokens):  logit -= presence_penalty * (count > 0)
//   2. greedy (temperature < kGreedyTemperature): the argmax of the
//      penalised logits, lowest token id among ties; steps 3-7 are skipped;
//   3. temperature: logit /= temperature;
//   4. top-k: keep tokens whose logit is >= the k-th largest (ties at the
//      boundary are all kept, as in Hugging Face and vLLM);
//   5. top-p over the softmax of the survivors: sorted by probability
//      (descending, lower id first among ties), keep a token while the mass
//      of the tokens before it is < top_p (the first token always stays);
//   6. min-p: keep tokens with p >= min_p * p_max (p renormalised over the
//      survivors of 4-5; the ratio is the same either way);
//   7. sample from the renormalised survivors by inverse CDF, walking them in
//      ascending token id, with u = UniformFromSeed(seed, position, kSample).
// Tokens whose logit is -inf (masked) never survive step 4.
// Note vLLM V1 applies min-p before top-k/top-p; the results differ only when
// top-p and min-p are both set.
//
// Log-probabilities: `logprob` and `top_logprobs` are of the RAW distribution,
// log_softmax of the logits as given (before penalties, temperature and
// truncation), as vLLM reports by default and the OpenAI API documents.
// `processed_logprob` is the log of the probability the token was actually
// drawn with (0 for greedy), which speculative verification needs.
//
// Determinism: the result depends only on the logits row, the params, the
// token counts and `position`, never on other sequences or call order.
//
// Thread-safety: TokenCounts is not thread-safe (one owner per sequence);
// the functions are pure.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sampling/philox.h"
#include "worker/sampling/sampling_params.h"

namespace tessera::sampling {

// How often each token occurred in a sequence's prompt and in its output,
// kept incrementally by the engine for the penalties.
class TokenCounts {
 public:
  struct Count {
    int32_t prompt = 0;
    int32_t output = 0;
  };

  void AddPrompt(absl::Span<const int32_t> tokens);
  void AddOutput(int32_t token);
  void Clear() { counts_.clear(); }

  const absl::flat_hash_map<int32_t, Count>& counts() const { return counts_; }
  bool empty() const { return counts_.empty(); }

 private:
  absl::flat_hash_map<int32_t, Count> counts_;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // raw distribution
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0;            // raw distribution (see above)
  int32_t rank = 0;             // 1 + tokens ranked above `token` in the raw distribution
  float processed_logprob = 0;  // log of the probability it was drawn with
  std::vector<TokenLogprob> top_logprobs;  // params.top_logprobs best raw, descending
};

// The distribution step 7 draws from: the surviving tokens in ascending id
// order with probabilities summing to 1 (a single token with 1 when greedy).
struct SamplingDistribution {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
};

// REQUIRES (else INVALID_ARGUMENT): logits.size() == vocab size > 0; no
// logit is NaN or +inf and at least one is finite; params valid
// (ValidateSamplingParams); every token in `counts` inside the vocabulary.
absl::StatusOr<SamplingDistribution> ComputeSamplingDistribution(absl::Span<const float> logits,
                                                                 const SamplingParams& params,
                                                                 const TokenCounts& counts);

// Draws the token at `position` (the index the new token will have in its
// sequence: prompt length + tokens generated so far). Same REQUIRES.
absl::StatusOr<SampleResult> Sample(absl::Span<const float> logits, const SamplingParams& params,
                                    const TokenCounts& counts, int64_t position);

}  // namespace tessera::sampling
