#include "worker/engine/scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace tessera::engine {

struct Scheduler::StepBuilder {
  ScheduledBatch batch;
  absl::Time now;
  int budget = 0;
  absl::flat_hash_set<SequenceId> scheduled;
  std::vector<InFlight> in_flight;
};

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(SchedulerOptions options) {
  if (options.max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError("max_num_batched_tokens must be positive");
  }
  if (options.max_num_seqs <= 0) return absl::InvalidArgumentError("max_num_seqs must be positive");
  if (options.max_model_len <= 0) {
    return absl::InvalidArgumentError("max_model_len must be positive");
  }
  if (options.vocab_size < 0) return absl::InvalidArgumentError("vocab_size must not be negative");
  if (!(options.watermark >= 0.0 && options.watermark < 1.0)) {
    return absl::InvalidArgumentError("watermark must be in [0, 1)");
  }
  BlockManagerOptions block_options;
  block_options.block_size = options.block_size;
  block_options.num_blocks = options.num_blocks;
  block_options.enable_prefix_caching = options.enable_prefix_caching;
  block_options.hash_seed = options.prefix_hash_seed;
  absl::StatusOr<std::unique_ptr<BlockManager>> blocks = BlockManager::Create(block_options);
  if (!blocks.ok()) return blocks.status();
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(options), *std::move(blocks)));
}

Scheduler::Scheduler(SchedulerOptions options, std::unique_ptr<BlockManager> blocks)
    : options_(std::move(options)),
      watermark_blocks_(static_cast<int>(options_.watermark * options_.num_blocks)),
      blocks_(std::move(blocks)) {}

// ---------------------------------------------------------------------------
// Requests.

absl::Status Scheduler::CheckAdmissible(absl::Span<const TokenId> prompt,
                                        absl::Span<const TokenId> output,
                                        const SamplingOptions& options) const {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive, got ", options.max_tokens));
  }
  auto check_ids = [&](absl::Span<const TokenId> ids, const char* what) -> absl::Status {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || (options_.vocab_size > 0 && ids[i] >= options_.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " token id ", ids[i], " at index ", i, " is outside the vocabulary [0, ",
            options_.vocab_size > 0 ? absl::StrCat(options_.vocab_size) : "inf", ")"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_ids(prompt, "prompt"); !s.ok()) return s;
  if (absl::Status s = check_ids(output, "output"); !s.ok()) return s;
  const int64_t num_prompt = static_cast<int64_t>(prompt.size());
  if (static_cast<int64_t>(output.size()) >= options.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the request already has ", output.size(),
                                                   " output tokens; max_tokens is ",
                                                   options.max_tokens));
  }
  const int64_t bs = options_.block_size;
  const int64_t prompt_blocks = (num_prompt + bs - 1) / bs;
  if (prompt_blocks > options_.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt of ", num_prompt, " tokens needs ", prompt_blocks, " KV blocks of ", bs,
        " tokens, more than the whole cache (", options_.num_blocks, " blocks)"));
  }
  const int64_t total = num_prompt + options.max_tokens;
  if (total > options_.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", num_prompt, " tokens) + max_tokens (", options.max_tokens, ") = ", total,
        " exceeds the model's context length of ", options_.max_model_len, " tokens"));
  }
  // The newest token's KV is never computed: the longest sequence holds
  // total - 1 tokens of KV.
  const int64_t kv_blocks = (total - 1 + bs - 1) / bs;
  if (kv_blocks > options_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", num_prompt, " tokens) + max_tokens (", options.max_tokens,
                     ") needs up to ", kv_blocks, " KV blocks of ", bs,
                     " tokens, more than the whole cache (", options_.num_blocks, " blocks)"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddSequence(SequenceId id, std::vector<TokenId> prompt,
                                    SamplingOptions options, std::vector<TokenId> output) {
  if (sequences_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " already exists"));
  }
  if (absl::Status s = CheckAdmissible(prompt, output, options); !s.ok()) return s;
  auto seq = std::make_unique<Sequence>(id, std::move(prompt), std::move(output),
                                        std::move(options), Now(), next_arrival_order_++);
  waiting_.insert(seq.get());
  sequences_.emplace(id, std::move(seq));
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(SequenceId id) {
  finished_pending_.erase(id);  // finished already; its token no longer matters
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->is_finished()) {
    return absl::NotFoundError(absl::StrCat("no active sequence ", id));
  }
  Sequence* seq = it->second.get();
  waiting_.erase(seq);
  running_.erase(seq);
  seq->Finish(FinishReason::kAbort, Now());
  ++counters_.num_aborted;
  if (InStepInFlight(id)) {
    aborted_in_flight_.push_back(id);
  } else {
    blocks_->Free(id);
    sequences_.erase(it);
  }
  return absl::OkStatus();
}

bool Scheduler::InStepInFlight(SequenceId id) const {
  return in_flight_.has_value() && std::any_of(in_flight_->begin(), in_flight_->end(),
                                               [id](const InFlight& e) { return e.id == id; });
}

absl::StatusOr<std::optional<SequenceOutput>> Scheduler::ResolvePendingToken(SequenceId id,
                                                                             TokenId token) {
  if (token < 0 || (options_.vocab_size > 0 && token >= options_.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("resolved token id ", token, " for sequence ", id, " is out of range"));
  }
  SequenceOutput out;
  out.id = id;
  out.new_token_ids = {token};
  out.finished = true;
  if (auto done = finished_pending_.find(id); done != finished_pending_.end()) {
    const std::unique_ptr<Sequence> seq = std::move(done->second);
    finished_pending_.erase(done);
    seq->ResolvePendingToken(token);
    out.finish_reason = seq->CheckStop(options_.max_model_len);  // a stop id before the length
    FillOutput(*seq, &out);
    return out;
  }
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->is_finished() || !it->second->has_pending_token()) {
    return std::nullopt;
  }
  Sequence* seq = it->second.get();
  seq->ResolvePendingToken(token);
  out.finish_reason = seq->CheckStop(options_.max_model_len);
  if (out.finish_reason == FinishReason::kNone) return std::nullopt;
  waiting_.erase(seq);  // preempted while its token was pending
  running_.erase(seq);
  seq->Finish(out.finish_reason, Now());
  ++counters_.num_finished;
  FillOutput(*seq, &out);
  if (InStepInFlight(id)) {
    aborted_in_flight_.push_back(id);  // its KV is being written: freed when the step completes
  } else {
    blocks_->Free(id);
    sequences_.erase(it);
  }
  return out;
}

void Scheduler::Retire(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  if (it->second->has_pending_token()) finished_pending_[id] = std::move(it->second);
  sequences_.erase(it);
}

const Sequence* Scheduler::FindSequence(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->is_finished()) return nullptr;
  return it->second.get();
}

// ---------------------------------------------------------------------------
// Schedule.

absl::StatusOr<ScheduledBatch> Scheduler::Schedule(const DraftTokens* drafts) {
  if (in_flight_.has_value()) {
    return absl::FailedPreconditionError(
        "Schedule called while a step is in flight; call OnStepDone first");
  }
  StepBuilder step;
  step.now = Now();
  step.budget = options_.max_num_batched_tokens;
  step.batch.block_size = options_.block_size;
  ScheduleDecodes(step, drafts);
  ScheduleRunningPrefills(step);
  if (step.batch.preempted.empty()) ScheduleWaiting(step);
  if (!step.batch.empty()) {
    step.batch.step = next_step_++;
    ++counters_.num_steps;
    in_flight_ = std::move(step.in_flight);
  }
  return std::move(step.batch);
}

std::vector<SequenceId> Scheduler::DecodingSequences() const {
  std::vector<SequenceId> ids;
  for (const Sequence* seq : running_) {
    if (seq->status() == SequenceStatus::kRunning && seq->num_uncomputed_tokens() == 1) {
      ids.push_back(seq->id());
    }
  }
  return ids;
}

int Scheduler::DraftRoom(const Sequence& seq, int offered, const StepBuilder& step) const {
  // Verifying k drafts emits up to k + 1 tokens: stay within max_tokens and
  // the context, so no KV is written past what plain decoding could reach.
  const int left = std::min(seq.options().max_tokens - seq.num_output_tokens(),
                            options_.max_model_len - seq.num_tokens());
  // Drafts use the tail block's room and free blocks beyond one per running
  // sequence, so they never cause a preemption.
  const int bs = options_.block_size;
  const int tail = (bs - blocks_->NumSlots(seq.id()) % bs) % bs;
  const int free_blocks = (blocks_->MaxAppendableSlots(seq.id()) - tail) / bs;
  const int spare = std::max(0, free_blocks - static_cast<int>(running_.size()));
  return std::max(0, std::min({offered, left - 1, step.budget, tail + spare * bs}));
}

void Scheduler::ScheduleDecodes(StepBuilder& step, const DraftTokens* drafts) {
  const std::vector<Sequence*> order(running_.begin(), running_.end());
  for (Sequence* seq : order) {
    if (step.budget == 0) break;
    if (seq->status() != SequenceStatus::kRunning || seq->num_uncomputed_tokens() != 1) continue;
    bool self_preempted = false;
    while (!blocks_->CanAppendSlots(seq->id(), 1)) {
      Sequence* victim = FindVictim(seq, step);
      if (victim == nullptr) victim = seq;
      Preempt(victim, step);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted || !blocks_->AppendSlot(seq->id()).ok()) continue;
    absl::Span<const TokenId> draft;
    if (drafts != nullptr) {
      if (auto it = drafts->find(seq->id()); it != drafts->end()) {
        step.budget -= 1;  // the decode slot, for DraftRoom
        const int k = DraftRoom(*seq, static_cast<int>(it->second.size()), step);
        step.budget += 1;
        if (k > 0 && blocks_->AppendSlots(seq->id(), k).ok()) {
          draft = absl::MakeConstSpan(it->second).first(k);
        }
      }
    }
    AddToBatch(seq, 1, /*is_prefill=*/false, step, draft);
  }
}

void Scheduler::ScheduleRunningPrefills(StepBuilder& step) {
  const std::vector<Sequence*> order(running_.begin(), running_.end());
  for (Sequence* seq : order) {
    if (step.budget == 0) break;
    if (seq->status() != SequenceStatus::kRunning || seq->num_uncomputed_tokens() <= 1 ||
        step.scheduled.contains(seq->id())) {
      continue;
    }
    int room = blocks_->MaxAppendableSlots(seq->id());
    while (room == 0) {
      Sequence* victim = FindVictim(seq, step);
      if (victim == nullptr) break;  // wait: the scheduled ones free blocks as they finish
      Preempt(victim, step);
      room = blocks_->MaxAppendableSlots(seq->id());
    }
    const int chunk = std::min({seq->num_uncomputed_tokens(), step.budget, room});
    if (chunk > 0 && blocks_->AppendSlots(seq->id(), chunk).ok()) {
      AddToBatch(seq, chunk, /*is_prefill=*/true, step);
    }
  }
}

void Scheduler::ScheduleWaiting(StepBuilder& step) {
  while (!waiting_.empty() && step.budget > 0 &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = *waiting_.begin();
    // Preempted while its newest token was pending: it waits for the id.
    if (seq->has_pending_token()) break;
    const PrefixMatch match = blocks_->FindCachedPrefix(seq->token_ids());
    // With nothing running, the whole pool is the request's: admission
    // guarantees it fits.
    const int reserve = running_.empty() ? 0 : watermark_blocks_;
    const int fit = blocks_->MaxAllocatableTokens(match, reserve);
    const int end = std::min({seq->num_tokens(), match.num_tokens + step.budget, fit});
    if (end <= match.num_tokens) break;  // FIFO: no overtaking
    if (!blocks_->Allocate(seq->id(), match, end).ok()) break;
    waiting_.erase(waiting_.begin());
    seq->set_num_computed_tokens(match.num_tokens);
    seq->RecordCachedTokens(match.num_tokens);
    seq->set_status(SequenceStatus::kRunning);
    running_.insert(seq);
    AddToBatch(seq, end - match.num_tokens, /*is_prefill=*/true, step);
  }
}

Sequence* Scheduler::FindVictim(const Sequence* seq, const StepBuilder& step) const {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (*it == seq) return nullptr;  // everything below is scheduled already
    if (!step.scheduled.contains((*it)->id())) return *it;
  }
  return nullptr;
}

void Scheduler::Preempt(Sequence* seq, StepBuilder& step) {
  blocks_->Free(seq->id());
  running_.erase(seq);
  seq->Preempt();
  waiting_.insert(seq);
  step.batch.preempted.push_back(seq->id());
  ++counters_.num_preemptions;
}

void Scheduler::AddToBatch(Sequence* seq, int num_tokens, bool is_prefill, StepBuilder& step,
                           absl::Span<const TokenId> draft) {
  const int start = seq->num_computed_tokens();
  ScheduledSequence out;
  out.id = seq->id();
  out.start_position = start;
  const auto tokens = seq->token_ids().subspan(start, num_tokens);
  out.token_ids.assign(tokens.begin(), tokens.end());
  out.needs_logits = start + num_tokens == seq->num_tokens();
  out.token_ids.insert(out.token_ids.end(), draft.begin(), draft.end());
  out.num_draft_tokens = static_cast<int>(draft.size());
  num_tokens += out.num_draft_tokens;
  out.num_tokens = num_tokens;
  out.is_prefill = is_prefill;
  const absl::Span<const BlockId> table = blocks_->BlockTable(seq->id());
  out.block_table.assign(table.begin(), table.end());
  out.slot_mapping.reserve(num_tokens);
  blocks_->SlotMapping(seq->id(), start, num_tokens, &out.slot_mapping);
  seq->MarkScheduled(step.now);

  step.in_flight.push_back({seq->id(), num_tokens, out.needs_logits, out.num_draft_tokens,
                            std::vector<TokenId>(draft.begin(), draft.end())});
  step.scheduled.insert(seq->id());
  step.budget -= num_tokens;
  step.batch.num_batched_tokens += num_tokens;
  if (is_prefill) {
    ++step.batch.num_prefills;
    counters_.num_prefill_tokens += num_tokens;
  } else {
    ++step.batch.num_decodes;
    counters_.num_decode_tokens += num_tokens;
  }
  step.batch.sequences.push_back(std::move(out));
}

// ---------------------------------------------------------------------------
// Step completion.

absl::Status Scheduler::ValidateSampled(absl::Span<const SampledTokens> sampled) const {
  absl::flat_hash_map<SequenceId, bool> expected;  // id -> needs logits
  absl::flat_hash_map<SequenceId, const InFlight*> drafts;
  for (const InFlight& e : *in_flight_) {
    expected[e.id] = e.needs_logits;
    if (e.num_draft > 0) drafts[e.id] = &e;
  }
  absl::flat_hash_set<SequenceId> seen;
  for (const SampledTokens& s : sampled) {
    auto it = expected.find(s.id);
    if (it == expected.end() || !it->second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampled tokens for sequence ", s.id, ", which did not need logits"));
    }
    if (!seen.insert(s.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s.id, " has more than one sampling result"));
    }
    if (s.token_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("no token sampled for sequence ", s.id));
    }
    const bool pending = s.token_ids.size() == 1 && s.token_ids[0] == kPendingToken;
    if (pending && drafts.contains(s.id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s.id, " verified drafts but its token is pending"));
    }
    for (TokenId t : s.token_ids) {
      if (pending) break;
      if (t < 0 || (options_.vocab_size > 0 && t >= options_.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sampled token id ", t, " for sequence ", s.id, " is out of range"));
      }
    }
    if (auto d = drafts.find(s.id); d != drafts.end()) {
      const std::vector<TokenId>& draft = d->second->draft;
      if (s.token_ids.size() > draft.size() + 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the tokens for sequence ", s.id, " are not accepted drafts followed by one token"));
      }
      if (s.draft_path.empty()) {
        if (!std::equal(s.token_ids.begin(), s.token_ids.end() - 1, draft.begin())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the tokens for sequence ", s.id, " are not accepted drafts followed by one token"));
        }
      } else {
        if (s.draft_path.size() + 1 != s.token_ids.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", s.id, ": draft_path must list every accepted token, and only those"));
        }
        for (size_t m = 0; m < s.draft_path.size(); ++m) {
          const int32_t node = s.draft_path[m];
          if (node < static_cast<int32_t>(m) || node >= static_cast<int32_t>(draft.size()) ||
              (m > 0 && node <= s.draft_path[m - 1]) || draft[node] != s.token_ids[m]) {
            return absl::InvalidArgumentError(
                absl::StrCat("sequence ", s.id, ": draft_path entry ", m, " (node ", node,
                             ") is not an accepted draft node in order"));
          }
        }
      }
    } else if (!s.draft_path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s.id, " has a draft_path but verified no drafts"));
    }
  }
  for (const InFlight& e : *in_flight_) {
    const auto it = sequences_.find(e.id);
    const bool live = it != sequences_.end() && !it->second->is_finished();
    if (e.needs_logits && live && !seen.contains(e.id)) {
      return absl::InvalidArgumentError(absl::StrCat("no sampling result for sequence ", e.id));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SequenceOutput>> Scheduler::OnStepDone(
    absl::Span<const SampledTokens> sampled) {
  if (!in_flight_.has_value()) {
    return absl::FailedPreconditionError("OnStepDone called with no step in flight");
  }
  if (absl::Status s = ValidateSampled(sampled); !s.ok()) return s;
  absl::flat_hash_map<SequenceId, const SampledTokens*> by_id;
  for (const SampledTokens& s : sampled) by_id[s.id] = &s;
  const absl::Time now = Now();
  std::vector<SequenceOutput> outputs;
  for (const InFlight& entry : *in_flight_) {
    auto it = by_id.find(entry.id);
    if (entry.num_draft > 0 && it != by_id.end()) {
      CompleteSpeculativeEntry(entry, *it->second, now, &outputs);
    } else {
      CompleteEntry(entry, it == by_id.end() ? nullptr : it->second, now, &outputs);
    }
  }
  in_flight_.reset();
  for (SequenceId id : aborted_in_flight_) {
    blocks_->Free(id);
    sequences_.erase(id);
  }
  aborted_in_flight_.clear();
  return outputs;
}

absl::StatusOr<std::vector<SequenceId>> Scheduler::OnStepFailed() {
  if (!in_flight_.has_value()) {
    return absl::FailedPreconditionError("OnStepFailed called with no step in flight");
  }
  const absl::Time now = Now();
  std::vector<SequenceId> aborted;
  for (const InFlight& entry : *in_flight_) {
    auto it = sequences_.find(entry.id);
    if (it == sequences_.end()) continue;
    Sequence* seq = it->second.get();
    if (!seq->is_finished()) {
      waiting_.erase(seq);
      running_.erase(seq);
      seq->Finish(FinishReason::kAbort, now);
      ++counters_.num_aborted;
      aborted.push_back(entry.id);
    }
    blocks_->Free(entry.id);
    sequences_.erase(it);
  }
  in_flight_.reset();
  for (SequenceId id : aborted_in_flight_) {
    if (sequences_.erase(id) > 0) blocks_->Free(id);
  }
  aborted_in_flight_.clear();
  return aborted;
}

void Scheduler::CompleteEntry(const InFlight& entry, const SampledTokens* sampled, absl::Time now,
                              std::vector<SequenceOutput>* outputs) {
  Sequence* seq = sequences_.at(entry.id).get();
  if (seq->is_finished()) return;  // aborted during the step
  seq->set_num_computed_tokens(seq->num_computed_tokens() + entry.num_tokens);
  if (absl::Status s =
          blocks_->CacheComputedBlocks(seq->id(), seq->token_ids(), seq->num_computed_tokens());
      !s.ok()) {
    // Unreachable: the sequence holds exactly these slots and tokens. The
    // blocks then just stay out of the prefix cache.
    LogError("prefix caching failed", {{"seq", seq->id()}, {"error", std::string(s.message())}});
  }
  if (sampled == nullptr) return;  // a prefill chunk short of the end

  SequenceOutput out;
  out.id = seq->id();
  FinishReason reason = FinishReason::kNone;
  for (TokenId t : sampled->token_ids) {
    seq->AppendToken(t, now);
    out.new_token_ids.push_back(t);
    reason = seq->CheckStop(options_.max_model_len);
    if (reason != FinishReason::kNone) break;
  }
  if (reason != FinishReason::kNone) {
    FinishSequence(seq, reason, now);
    out.finished = true;
    out.finish_reason = reason;
  }
  FillOutput(*seq, &out);
  if (out.finished) Retire(seq->id());
  outputs->push_back(std::move(out));
}

void Scheduler::FillOutput(const Sequence& seq, SequenceOutput* out) const {
  out->num_prompt_tokens = seq.num_prompt_tokens();
  out->num_output_tokens = seq.num_output_tokens();
  out->num_cached_tokens = seq.num_cached_tokens();
  out->num_preemptions = seq.num_preemptions();
  out->times = seq.times();
}

// A decode that verified drafts: keep the KV of the decode token and the
// accepted drafts, roll back the rest, then append like a plain step.
void Scheduler::CompleteSpeculativeEntry(const InFlight& entry, const SampledTokens& sampled,
                                         absl::Time now, std::vector<SequenceOutput>* outputs) {
  Sequence* seq = sequences_.at(entry.id).get();
  if (seq->is_finished()) return;  // aborted during the step
  const int accepted = static_cast<int>(sampled.token_ids.size()) - 1;
  absl::StatusOr<std::optional<BlockCopy>> copy =
      blocks_->Truncate(seq->id(), entry.num_draft - accepted);
  // The rolled-back tail was allocated this step and never shared, so no
  // copy is expected; should one be needed, recompute instead.
  const bool recompute = !copy.ok() || copy->has_value();
  const int computed = seq->num_computed_tokens() + 1 + accepted;
  SequenceOutput out;
  out.id = seq->id();
  FinishReason reason = FinishReason::kNone;
  for (TokenId t : sampled.token_ids) {
    seq->AppendToken(t, now);
    out.new_token_ids.push_back(t);
    reason = seq->CheckStop(options_.max_model_len);
    if (reason != FinishReason::kNone) break;
  }
  if (reason == FinishReason::kNone && recompute) {
    LogError("speculative rollback needs a block copy; recomputing the sequence",
             {{"seq", seq->id()}});
    blocks_->Free(seq->id());
    running_.erase(seq);
    seq->Preempt();
    waiting_.insert(seq);
    ++counters_.num_preemptions;
  } else if (!recompute) {
    seq->set_num_computed_tokens(std::min(computed, seq->num_tokens()));
    if (absl::Status s =
            blocks_->CacheComputedBlocks(seq->id(), seq->token_ids(), seq->num_computed_tokens());
        !s.ok()) {
      LogError("prefix caching failed", {{"seq", seq->id()}, {"error", std::string(s.message())}});
    }
  }
  if (reason != FinishReason::kNone) {
    FinishSequence(seq, reason, now);
    out.finished = true;
    out.finish_reason = reason;
  }
  FillOutput(*seq, &out);
  if (out.finished) Retire(seq->id());
  outputs->push_back(std::move(out));
}

void Scheduler::FinishSequence(Sequence* seq, FinishReason reason, absl::Time now) {
  seq->Finish(reason, now);
  running_.erase(seq);
  // Its computed full blocks stay in the prefix cache, evictable.
  blocks_->Free(seq->id());
  ++counters_.num_finished;
}

// ---------------------------------------------------------------------------
// Introspection.

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = counters_;
  s.num_running = num_running();
  s.num_waiting = num_waiting();
  s.blocks = blocks_->stats();
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  if (absl::Status s = blocks_->CheckInvariants(); !s.ok()) return s;
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  if (static_cast<int>(running_.size()) > options_.max_num_seqs) {
    return fail(running_.size(), " running sequences, limit ", options_.max_num_seqs);
  }
  for (const Sequence* seq : running_) {
    if (seq->status() != SequenceStatus::kRunning) {
      return fail("sequence ", seq->id(), " is running but ", SequenceStatusName(seq->status()));
    }
    if (!blocks_->Contains(seq->id())) return fail("running sequence ", seq->id(), " has no KV");
    if (seq->num_uncomputed_tokens() < 1) {
      return fail("running sequence ", seq->id(), " has nothing left to compute");
    }
    if (!in_flight_.has_value() && blocks_->NumSlots(seq->id()) != seq->num_computed_tokens()) {
      return fail("sequence ", seq->id(), " holds ", blocks_->NumSlots(seq->id()), " slots for ",
                  seq->num_computed_tokens(), " computed tokens");
    }
  }
  for (const Sequence* seq : waiting_) {
    if (seq->status() != SequenceStatus::kWaiting && seq->status() != SequenceStatus::kPreempted) {
      return fail("sequence ", seq->id(), " is queued but ", SequenceStatusName(seq->status()));
    }
    if (blocks_->Contains(seq->id()) || seq->num_computed_tokens() != 0) {
      return fail("queued sequence ", seq->id(), " holds KV");
    }
  }
  if (sequences_.size() != running_.size() + waiting_.size() + aborted_in_flight_.size()) {
    return fail(sequences_.size(), " sequences, but ", running_.size(), " running, ",
                waiting_.size(), " waiting and ", aborted_in_flight_.size(), " being aborted");
  }
  for (const auto& [id, seq] : sequences_) {
    const bool queued = running_.contains(seq.get()) || waiting_.contains(seq.get());
    if (seq->is_finished() == queued) {
      return fail("sequence ", id, " is ", SequenceStatusName(seq->status()),
                  queued ? " but queued" : " but in no queue");
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::engine
