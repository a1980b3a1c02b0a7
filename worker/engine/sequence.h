// Sequence: one generation request as the engine core sees it — token ids in,
// token ids out, plus the bookkeeping the scheduler needs (status, how much
// of its KV is filled, timings for metrics).
//
// Tokens are one list: the prompt followed by the output. The output may
// start non-empty (a request resumed or migrated from another worker brings
// the tokens it already generated); those count toward max_tokens like the
// ones sampled here. The KV cache holds tokens [0, num_computed_tokens()).
// The newest sampled token's KV is computed by the next step, so a running
// sequence that is fully prefilled has exactly one uncomputed token (it
// decodes); more than one means a prefill (or a recompute after preemption)
// is in progress.
//
// Thread-safety: not thread-safe. The scheduler owns every Sequence and
// mutates it from the engine loop only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/block_hash.h"

namespace tessera::engine {

using SequenceId = uint64_t;
// Token ids are base's (base/block_hash.h); engine::TokenId names them too.
using ::tessera::TokenId;

// The id of a token that was sampled in a step whose result is not back on
// the host yet (the engine's pipelined steps, engine.h). Only the newest
// token of a sequence can be pending, it is never part of the computed
// prefix, and the scheduler replaces it (Scheduler::ResolvePendingToken)
// before the step that computes it completes.
inline constexpr TokenId kPendingToken = -1;

// What the engine core needs of a request's sampling parameters. The
// sampler's own parameters (temperature, top-p, seeds, penalties, ...) live
// in worker/sampling and are found through sampler_state_id, which the core
// never interprets.
struct SamplingOptions {
  // Bound on output tokens, including any given up front. REQUIRES: > 0.
  int max_tokens = 16;
  // The model's end-of-sequence ids; they stop generation unless ignore_eos.
  std::vector<TokenId> eos_token_ids;
  bool ignore_eos = false;
  // Further ids that stop generation (always honoured).
  std::vector<TokenId> stop_token_ids;
  // Higher runs first; FIFO by arrival within one priority.
  int priority = 0;
  // Opaque handle for the sampler.
  uint64_t sampler_state_id = 0;
};

enum class SequenceStatus {
  kWaiting,    // queued, never admitted
  kRunning,    // admitted: holds KV blocks, scheduled every step it fits
  kPreempted,  // evicted to free blocks; queued to recompute its tokens
  kFinished,
};

enum class FinishReason {
  kNone,
  kStop,    // an EOS id (unless ignore_eos) or a stop token id was sampled
  kLength,  // max_tokens reached (or the model's context length)
  kAbort,   // cancelled by the caller
};

absl::string_view SequenceStatusName(SequenceStatus status);
// "stop", "length", "abort" (OpenAI's spelling); "" for kNone.
absl::string_view FinishReasonName(FinishReason reason);

// Unset (nullopt) until the event happens.
struct SequenceTimes {
  absl::Time arrival;
  std::optional<absl::Time> first_scheduled;
  std::optional<absl::Time> first_token;  // first token sampled here
  std::optional<absl::Time> finished;
};

class Sequence {
 public:
  // REQUIRES: prompt non-empty.
  Sequence(SequenceId id, std::vector<TokenId> prompt, std::vector<TokenId> output,
           SamplingOptions options, absl::Time arrival, uint64_t arrival_order);

  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  SequenceId id() const { return id_; }
  const SamplingOptions& options() const { return options_; }
  int priority() const { return options_.priority; }
  // Monotonic admission-queue order assigned at arrival (FIFO tie-break).
  uint64_t arrival_order() const { return arrival_order_; }

  // Prompt followed by output.
  absl::Span<const TokenId> token_ids() const { return tokens_; }
  absl::Span<const TokenId> prompt_token_ids() const {
    return absl::MakeConstSpan(tokens_).first(num_prompt_tokens_);
  }
  absl::Span<const TokenId> output_token_ids() const {
    return absl::MakeConstSpan(tokens_).subspan(num_prompt_tokens_);
  }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }
  // Output tokens given at arrival (not sampled here).
  int num_resumed_output_tokens() const { return num_resumed_output_tokens_; }
  TokenId last_token_id() const { return tokens_.back(); }

  SequenceStatus status() const { return status_; }
  bool is_finished() const { return status_ == SequenceStatus::kFinished; }
  FinishReason finish_reason() const { return finish_reason_; }

  // Tokens whose KV is in the cache.
  int num_computed_tokens() const { return num_computed_tokens_; }
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }
  // Tokens served from the prefix cache at first admission (usage report).
  int num_cached_tokens() const { return num_cached_tokens_.value_or(0); }
  int num_preemptions() const { return num_preemptions_; }
  const SequenceTimes& times() const { return times_; }

  // --- Mutators, for the scheduler. ---

  void set_status(SequenceStatus status) { status_ = status; }
  void set_num_computed_tokens(int n) { num_computed_tokens_ = n; }
  // Records the prefix-cache hit of the first admission; later calls (a
  // re-admission after preemption) are ignored.
  void RecordCachedTokens(int n);
  void MarkScheduled(absl::Time now);
  void AppendToken(TokenId token, absl::Time now);
  // Whether the newest token is kPendingToken.
  bool has_pending_token() const { return !tokens_.empty() && tokens_.back() == kPendingToken; }
  // The newest token's id, once known. REQUIRES: has_pending_token().
  void ResolvePendingToken(TokenId token) { tokens_.back() = token; }
  // Drops the KV of computed tokens and queues the sequence again; the
  // tokens (prompt and output) are kept for recomputation.
  void Preempt();
  void Finish(FinishReason reason, absl::Time now);

  // The reason to stop after the newest token, or kNone to go on.
  // `max_model_len` bounds prompt + output. A pending newest token can only
  // stop by length (its id is checked once resolved).
  FinishReason CheckStop(int max_model_len) const;

 private:
  const SequenceId id_;
  const SamplingOptions options_;
  const uint64_t arrival_order_;
  std::vector<TokenId> tokens_;
  const int num_prompt_tokens_;
  const int num_resumed_output_tokens_;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  int num_computed_tokens_ = 0;
  std::optional<int> num_cached_tokens_;
  int num_preemptions_ = 0;
  SequenceTimes times_;
};

}  // namespace tessera::engine
