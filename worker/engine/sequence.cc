#include "worker/engine/sequence.h"

#include <algorithm>
#include <utility>

namespace tessera::engine {

absl::string_view SequenceStatusName(SequenceStatus status) {
  switch (status) {
    case SequenceStatus::kWaiting:
      return "waiting";
    case SequenceStatus::kRunning:
      return "running";
    case SequenceStatus::kPreempted:
      return "preempted";
    case SequenceStatus::kFinished:
      return "finished";
  }
  return "unknown";
}

absl::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

Sequence::Sequence(SequenceId id, std::vector<TokenId> prompt, std::vector<TokenId> output,
                   SamplingOptions options, absl::Time arrival, uint64_t arrival_order)
    : id_(id),
      options_(std::move(options)),
      arrival_order_(arrival_order),
      tokens_(std::move(prompt)),
      num_prompt_tokens_(static_cast<int>(tokens_.size())),
      num_resumed_output_tokens_(static_cast<int>(output.size())) {
  tokens_.insert(tokens_.end(), output.begin(), output.end());
  times_.arrival = arrival;
}

void Sequence::RecordCachedTokens(int n) {
  if (!num_cached_tokens_.has_value()) num_cached_tokens_ = n;
}

void Sequence::MarkScheduled(absl::Time now) {
  if (!times_.first_scheduled.has_value()) times_.first_scheduled = now;
}

void Sequence::AppendToken(TokenId token, absl::Time now) {
  tokens_.push_back(token);
  if (!times_.first_token.has_value()) times_.first_token = now;
}

void Sequence::Preempt() {
  num_computed_tokens_ = 0;
  status_ = SequenceStatus::kPreempted;
  ++num_preemptions_;
}

void Sequence::Finish(FinishReason reason, absl::Time now) {
  status_ = SequenceStatus::kFinished;
  finish_reason_ = reason;
  times_.finished = now;
}

FinishReason Sequence::CheckStop(int max_model_len) const {
  if (num_output_tokens() > num_resumed_output_tokens_ && !has_pending_token()) {
    const TokenId last = last_token_id();
    auto contains = [last](const std::vector<TokenId>& ids) {
      return std::find(ids.begin(), ids.end(), last) != ids.end();
    };
    if (!options_.ignore_eos && contains(options_.eos_token_ids)) return FinishReason::kStop;
    if (contains(options_.stop_token_ids)) return FinishReason::kStop;
  }
  if (num_output_tokens() >= options_.max_tokens) return FinishReason::kLength;
  if (num_tokens() >= max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

}  // namespace tessera::engine
