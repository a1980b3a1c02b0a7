// Lossless verification of a draft chain (or token tree, VerifyTree) against
// the target model's logits.
//
// Input: k draft tokens d_1..d_k for a sequence whose next token has index
// `position`, and the target's logits for k+1 positions (row i predicts the
// token at position + i, given the drafts before it). Each row goes through
// the same processing as plain decoding (penalties, temperature, top-k,
// top-p, min-p: sampling::ComputeSamplingDistribution), with the token
// counts updated by the tokens emitted before it, giving p_i.
//
// Rule (Leviathan et al. 2023; Chen et al. 2023), for i = 1..k:
//   accept d_i with probability min(1, p_i(d_i) / q_i(d_i));
//   on rejection emit a token drawn from max(0, p_i - q_i), normalized, and
//   stop; if every draft is accepted, emit a bonus token drawn from p_{k+1}.
// q_i is the draft's exact distribution, one-hot on d_i when the draft gives
// none (greedy and model-free drafts). With a greedy target p_i is one-hot
// on the argmax, so this reduces to "accept while d_i == argmax, then the
// argmax". The output distribution equals plain decoding's for any q.
//
// Randomness comes from the request's seed, counter-based (worker/sampling/
// philox.h), keyed by the index of the token being decided:
//   acceptance test of d_i       UniformFromSeed(seed, position+i-1, kSpeculativeAccept)
//   residual draw at that index  UniformFromSeed(seed, position+i-1, kSpeculativeResample)
//   bonus token (and k = 0)      sampling::Sample at position+k (stream kSample),
// so the result depends only on the logits, the draft and the seed, never on
// the batch. Residual and bonus draws walk tokens in ascending id (inverse
// CDF), like the sampler.
//
// Thread-safety: pure functions (the counts are the caller's).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sampling/sampler.h"
#include "worker/spec/draft_source.h"

namespace tessera::spec {

struct VerifyResult {
  // Accepted drafts followed by one token from the target (k+1 at most).
  std::vector<TokenId> tokens;
  int num_accepted = 0;
  // VerifyTree: the accepted nodes' indices, root to leaf (num_accepted).
  std::vector<int32_t> path;
};

// `logits` holds draft.size() + 1 rows of `vocab` floats. `q` is empty or
// has one entry per draft token. `counts` gets every emitted token as an
// output token (as plain decoding's caller would add them). INVALID_ARGUMENT
// for malformed input (row count, a q entry not giving its draft token a
// positive probability, ...) or non-finite logits; nothing is emitted then.
absl::StatusOr<VerifyResult> VerifyChain(absl::Span<const float> logits, int64_t vocab,
                                         absl::Span<const TokenId> draft,
                                         absl::Span<const DraftDistribution> q,
                                         const sampling::SamplingParams& params,
                                         sampling::TokenCounts* counts, int64_t position);

// Token trees (parents not a chain): the target-only "sample and match"
// walk. Row 0 of `logits` belongs to the last committed token, row 1 + i to
// draft node i (computed with the tree attention mask: node i saw the
// context and its ancestors). From the root, at each node the target's token
// is drawn from that node's row exactly as plain decoding draws it
// (sampling::Sample: penalties, temperature, top-k/p, min-p, the counts
// updated by the tokens emitted so far, Philox keyed by seed and position +
// depth, stream kSample); when a child of the node carries that token the
// walk moves there (an accepted draft), otherwise the token is emitted and
// the walk stops (at a leaf this is the bonus token). Every emitted token is
// drawn from the target's distribution given the tokens before it, so the
// walk is lossless for any tree, and with the same seed it emits exactly
// the tokens plain decoding would. q is not used. INVALID_ARGUMENT for
// malformed input (parents not each -1 or an earlier node, row count) or
// non-finite logits.
absl::StatusOr<VerifyResult> VerifyTree(absl::Span<const float> logits, int64_t vocab,
                                        absl::Span<const TokenId> tokens,
                                        absl::Span<const int32_t> parents,
                                        const sampling::SamplingParams& params,
                                        sampling::TokenCounts* counts, int64_t position);

// The first k nodes of `draft` (a chain or a tree; k <= draft.tokens.size())
// verified by the rule for their shape: VerifyChain (with the draft's q)
// or VerifyTree. `logits` holds k + 1 rows.
absl::StatusOr<VerifyResult> VerifyDraft(absl::Span<const float> logits, int64_t vocab,
                                         const Draft& draft, int k,
                                         const sampling::SamplingParams& params,
                                         sampling::TokenCounts* counts, int64_t position);

// Greedy verification from the argmax of each of the k + 1 rows alone (what
// a runner that samples on its device returns): accept while draft[i] ==
// argmax[i], then emit argmax at the first mismatch, or the bonus argmax[k].
// The tokens VerifyChain gives a greedy target for the same logits. `counts`
// gets every emitted token. REQUIRES: argmax.size() == draft.size() + 1.
VerifyResult VerifyChainArgmax(absl::Span<const TokenId> draft, absl::Span<const int32_t> argmax,
                               sampling::TokenCounts* counts);

// The logits row that emitted token m of `result` was decided from: row m
// along a chain; along a tree's path the row of the node before it (row 0,
// the last committed token's, for m = 0).
int64_t LogitsRowOf(const VerifyResult& result, size_t m);

// Checks a draft before it is scheduled: token ids inside the vocabulary,
// parents empty or one per token, each -1 or an earlier node, no two
// siblings with the same token; q empty or one well-formed distribution per
// token that gives its token a positive probability.
absl::Status ValidateDraft(const Draft& draft, int64_t vocab);

// The raw log-probability of `token` in a logits row and the `top_n` best
// raw alternatives (descending), as sampling::Sample reports them.
void RawLogprobs(absl::Span<const float> row, TokenId token, int top_n, float* logprob,
                 std::vector<sampling::TokenLogprob>* top);

}  // namespace tessera::spec
