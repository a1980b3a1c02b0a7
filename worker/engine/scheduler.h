// Scheduler: continuous batching for one worker's engine loop. Each step it
// decides which tokens of which sequences the model computes, within a token
// budget and the KV blocks available, and afterwards folds the sampled
// tokens back in:
//
//   batch = scheduler.Schedule();            // what to compute
//   ... model runs batch, sampler picks tokens for needs_logits entries ...
//   outputs = scheduler.OnStepDone(sampled);  // append, stop, free
//
// Policy (README.md has the reasoning):
//  1. Decode first: every running sequence that has finished its prefill
//     gets one token (its newest), in priority order, while the budget lasts.
//  2. Chunked prefill: running sequences still prefilling, then waiting
//     ones, get chunks of their remaining tokens as the budget and the free
//     blocks allow; a long prompt spreads over several steps.
//  3. Order: higher SamplingOptions::priority first, FIFO within a priority.
//     A waiting sequence that does not fit blocks those behind it (no
//     overtaking), and none is admitted in a step that preempted.
//  4. Preemption by recompute: when a running sequence needs a block and
//     none is free, the lowest-priority, most recently arrived running
//     sequence not yet scheduled this step loses its blocks and goes back to
//     the queue with its tokens (prompt and output), to be prefilled again.
//     If there is none below it, the sequence itself is preempted (decode)
//     or waits a step (prefill).
//  5. Admission: AddSequence refuses at once (INVALID_ARGUMENT) a request
//     that can never run: empty prompt, bad ids, prompt + max_tokens beyond
//     the context length, or more KV than the whole cache.
//
// Thread-safety: not thread-safe; the engine loop owns it and calls every
// method from its one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/engine/block_manager.h"
#include "worker/engine/sequence.h"

namespace tessera::engine {

struct SchedulerOptions {
  // KV cache geometry (the model runner's).
  int block_size = 16;
  int num_blocks = 0;
  // Tokens computed per step, over all sequences.
  int max_num_batched_tokens = 2048;
  // Running sequences (holding KV blocks) at once.
  int max_num_seqs = 256;
  // The model's context length: prompt + output tokens.
  int max_model_len = 4096;
  // When > 0, token ids must be below it.
  int vocab_size = 0;
  bool enable_prefix_caching = true;
  uint64_t prefix_hash_seed = 0;
  // Fraction of the blocks a waiting sequence may not take while others
  // run, so running ones can grow without preempting right away.
  double watermark = 0.01;
  // Time source for SequenceTimes; absl::Now when empty.
  std::function<absl::Time()> clock;
};

// One sequence's share of a step.
struct ScheduledSequence {
  SequenceId id = 0;
  // Positions [start_position, start_position + num_tokens) are computed;
  // the KV of the positions before them is in the cache already.
  int start_position = 0;
  int num_tokens = 0;
  std::vector<TokenId> token_ids;  // the ids at those positions
  // True when the chunk ends at the newest token: the model returns the last
  // position's logits and the sampler picks the next token.
  bool needs_logits = false;
  // False for a decode (one token after a finished prefill).
  bool is_prefill = false;
  // Covers every position up to start_position + num_tokens.
  std::vector<BlockId> block_table;
  // One KV slot per computed token: block_table[p / bs] * bs + p % bs.
  std::vector<int64_t> slot_mapping;
  // Speculative decode: the last num_draft_tokens of token_ids are draft
  // tokens to verify; logits are needed for them and the token before
  // (num_draft_tokens + 1 rows).
  int num_draft_tokens = 0;

  int context_len() const { return start_position + num_tokens; }
};

struct ScheduledBatch {
  uint64_t step = 0;
  int block_size = 0;
  // Decodes first, then prefill chunks.
  std::vector<ScheduledSequence> sequences;
  int num_batched_tokens = 0;
  int num_decodes = 0;
  int num_prefills = 0;
  // Sequences preempted while forming this batch (for metrics and logs).
  std::vector<SequenceId> preempted;

  bool empty() const { return sequences.empty(); }
};

// Draft tokens offered for a step, by sequence (speculative decoding).
using DraftTokens = absl::flat_hash_map<SequenceId, std::vector<TokenId>>;

// The sampler's result for one sequence that needed logits. One token for a
// plain step; a speculative verifier may give several (accepted drafts plus
// one), which are appended in order until a stop condition. For an entry
// with draft tokens, token_ids must be a prefix of the drafts (the accepted
// ones) followed by one token; the KV of rejected drafts is rolled back.
// Token trees: the drafts are a tree's nodes and draft_path lists the
// accepted nodes (increasing indices into the drafts, root to leaf), with
// token_ids[m] == drafts[draft_path[m]]; the caller has already moved those
// nodes' K/V to the slots right after the decode token (in path order), so
// the rollback is the same as for a chain. (The parent links are the
// caller's to check: the scheduler does not see them.)
// Pipelined steps: token_ids == {kPendingToken} for a sequence whose token
// was drawn on a device and is not back yet (no drafts); the sequence gets
// the placeholder, decodes it next step, and ResolvePendingToken supplies
// its id before that step completes.
struct SampledTokens {
  SequenceId id = 0;
  std::vector<TokenId> token_ids;
  std::vector<int32_t> draft_path;  // empty: a chain's accepted prefix
};

// What a step produced for one sequence, for its stream.
struct SequenceOutput {
  SequenceId id = 0;
  std::vector<TokenId> new_token_ids;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  // Accounting, complete when finished.
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
  int num_cached_tokens = 0;
  int num_preemptions = 0;
  SequenceTimes times;
};

struct SchedulerStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t num_finished = 0;  // stop or length
  int64_t num_aborted = 0;
  int64_t num_prefill_tokens = 0;  // computed in prefill chunks
  int64_t num_decode_tokens = 0;
  BlockManagerStats blocks;
};

class Scheduler {
 public:
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(SchedulerOptions options);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }

  // Why a request of this shape can never run here, or OK.
  absl::Status CheckAdmissible(absl::Span<const TokenId> prompt, absl::Span<const TokenId> output,
                               const SamplingOptions& options) const;

  // Queues a request. `output` holds tokens it already generated elsewhere
  // (resume / migration); they are recomputed with the prompt and count
  // toward max_tokens. INVALID_ARGUMENT when CheckAdmissible refuses,
  // ALREADY_EXISTS for a known id.
  absl::Status AddSequence(SequenceId id, std::vector<TokenId> prompt, SamplingOptions options,
                           std::vector<TokenId> output = {});

  // Cancels a request and frees its blocks at once (when it is part of the
  // step in flight, when that step completes, as its KV is being written).
  // NOT_FOUND for an unknown or finished id.
  absl::Status Abort(SequenceId id);

  // Forms the next step. An empty batch means there is nothing to compute;
  // otherwise OnStepDone must follow before the next Schedule
  // (FAILED_PRECONDITION if not). `drafts` attach draft tokens to decodes:
  // a decode takes 1 + k tokens (k cut to the budget, the free blocks
  // without preempting, and what max_tokens and the context still allow).
  absl::StatusOr<ScheduledBatch> Schedule(const DraftTokens* drafts = nullptr);

  // Running sequences that will decode next step (prefill done), in queue
  // order: the ones a speculative step can ask drafts for.
  std::vector<SequenceId> DecodingSequences() const;

  // Completes the step in flight: the batch's KV is computed and `sampled`
  // holds one entry per sequence with needs_logits (any order). Advances
  // computed tokens, registers full blocks in the prefix cache, appends the
  // tokens, applies stop conditions, finishes and frees. Returns one output
  // per sequence that got tokens or finished. INVALID_ARGUMENT, changing
  // nothing, when `sampled` does not match the batch (missing, unexpected or
  // duplicate entries, ids outside the vocabulary).
  absl::StatusOr<std::vector<SequenceOutput>> OnStepDone(absl::Span<const SampledTokens> sampled);
  // The id of sequence `id`'s pending newest token (a step completed with
  // kPendingToken for it), now known: the stop conditions its id decides
  // apply. Returns the sequence's output when it is finished: stopped by
  // this id now (freed at once, or when the step in flight that includes it
  // completes), or finished by length when the placeholder was appended
  // (its output then carries the id and the final reason: kStop when the id
  // is a stop id too, as a plain step decides). nullopt when it goes on, or
  // for an id without a pending token (aborted, unknown).
  // INVALID_ARGUMENT for a token outside the vocabulary.
  absl::StatusOr<std::optional<SequenceOutput>> ResolvePendingToken(SequenceId id, TokenId token);
  // Ends the step in flight without results (the model step failed, or its
  // tokens were refused): its KV is unknown, so every sequence of the step
  // is aborted and freed, with those aborted during it; returns their ids
  // (those not aborted before). The scheduler takes new steps afterwards.
  // FAILED_PRECONDITION with no step in flight.
  absl::StatusOr<std::vector<SequenceId>> OnStepFailed();

  bool HasUnfinished() const { return !running_.empty() || !waiting_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool step_in_flight() const { return in_flight_.has_value(); }
  // nullptr for an unknown or finished id.
  const Sequence* FindSequence(SequenceId id) const;
  const BlockManager& block_manager() const { return *blocks_; }
  // Drains the prefix-cache events (block_manager.h).
  std::vector<KvCacheEvent> TakeKvEvents() { return blocks_->TakeEvents(); }
  // Evicts every cached block no sequence uses; returns how many.
  int ResetPrefixCache() { return blocks_->ResetPrefixCache(); }
  SchedulerStats stats() const;

  // Verifies the scheduler's and the block manager's invariants (queues
  // agree with statuses, running sequences hold exactly their computed
  // tokens' slots between steps, waiting ones hold none, ...).
  absl::Status CheckInvariants() const;

 private:
  // Queue order: higher priority first, then earlier arrival.
  struct Before {
    bool operator()(const Sequence* a, const Sequence* b) const {
      if (a->priority() != b->priority()) return a->priority() > b->priority();
      return a->arrival_order() < b->arrival_order();
    }
  };
  using Queue = std::set<Sequence*, Before>;
  struct InFlight {
    SequenceId id;
    int num_tokens;
    bool needs_logits;
    int num_draft = 0;  // of num_tokens, the trailing draft tokens
    std::vector<TokenId> draft;
  };
  // State of one Schedule() call.
  struct StepBuilder;

  Scheduler(SchedulerOptions options, std::unique_ptr<BlockManager> blocks);

  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  void ScheduleDecodes(StepBuilder& step, const DraftTokens* drafts);
  // Draft tokens `seq` may verify this step (after its one decode slot).
  int DraftRoom(const Sequence& seq, int offered, const StepBuilder& step) const;
  void ScheduleRunningPrefills(StepBuilder& step);
  void ScheduleWaiting(StepBuilder& step);
  // The lowest-ordered running sequence below `seq` not scheduled this
  // step, or nullptr.
  Sequence* FindVictim(const Sequence* seq, const StepBuilder& step) const;
  void Preempt(Sequence* seq, StepBuilder& step);
  void AddToBatch(Sequence* seq, int num_tokens, bool is_prefill, StepBuilder& step,
                  absl::Span<const TokenId> draft = {});
  absl::Status ValidateSampled(absl::Span<const SampledTokens> sampled) const;
  // Applies one in-flight entry; appends to *outputs when there is news.
  void CompleteEntry(const InFlight& entry, const SampledTokens* sampled, absl::Time now,
                     std::vector<SequenceOutput>* outputs);
  void CompleteSpeculativeEntry(const InFlight& entry, const SampledTokens& sampled, absl::Time now,
                                std::vector<SequenceOutput>* outputs);
  void FinishSequence(Sequence* seq, FinishReason reason, absl::Time now);
  // Forgets a finished sequence, or keeps it until its pending token is
  // resolved (ResolvePendingToken).
  void Retire(SequenceId id);
  // Whether the step in flight includes `id`.
  bool InStepInFlight(SequenceId id) const;
  void FillOutput(const Sequence& seq, SequenceOutput* out) const;

  const SchedulerOptions options_;
  const int watermark_blocks_;
  std::unique_ptr<BlockManager> blocks_;
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  Queue waiting_;  // kWaiting and kPreempted
  Queue running_;
  uint64_t next_arrival_order_ = 0;
  uint64_t next_step_ = 1;
  std::optional<std::vector<InFlight>> in_flight_;
  // Aborted (or stopped by a resolved pending token) while in the step in
  // flight: freed when it completes.
  std::vector<SequenceId> aborted_in_flight_;
  // Finished by length with a pending newest token, until it is resolved.
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> finished_pending_;
  SchedulerStats counters_;  // the cumulative fields
};

}  // namespace tessera::engine
