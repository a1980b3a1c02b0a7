#include "worker/engine/async_test_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/sampling/sampler.h"

namespace tessera::engine {

void AsyncTestRunner::Log(std::string entry) {
  absl::MutexLock lock(&mu_);
  log_.push_back(std::move(entry));
}

std::vector<std::string> AsyncTestRunner::log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

absl::Status AsyncTestRunner::Forward(const runner::ForwardBatch& batch,
                                      std::vector<float>* logits) {
  if (!queued_.empty()) {
    return absl::FailedPreconditionError("a synchronous Forward while steps are submitted");
  }
  Log(absl::StrCat("forward ", ++steps_));
  return base_->Forward(batch, logits);
}

absl::Status AsyncTestRunner::ForwardSample(const runner::ForwardBatch& batch,
                                            absl::Span<const runner::DeviceSamplingRow> rows,
                                            std::vector<int32_t>* tokens) {
  if (absl::Status s = SubmitSample(batch, rows, {}); !s.ok()) return s;
  return CollectSample(tokens);
}

absl::Status AsyncTestRunner::SubmitSample(
    const runner::ForwardBatch& batch, absl::Span<const runner::DeviceSamplingRow> rows,
    absl::Span<const runner::PreviousStepToken> from_previous) {
  if (queued_.size() >= 2) {
    return absl::FailedPreconditionError("two steps are submitted and not collected already");
  }
  if (rows.size() != batch.logits_indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " sampling rows for ",
                                                   batch.logits_indices.size(), " logits rows"));
  }
  runner::ForwardBatch resolved = batch;
  for (const runner::PreviousStepToken& p : from_previous) {
    if (steps_ == 0 || p.token_index < 0 || p.token_index >= batch.num_tokens() || p.row < 0 ||
        p.row >= static_cast<int32_t>(last_drawn_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("previous-step token ", p.token_index,
                                                     " from row ", p.row, " is out of range"));
    }
    resolved.token_ids[p.token_index] = last_drawn_[p.row];
  }
  std::vector<float> logits;
  if (absl::Status s = base_->Forward(resolved, &logits); !s.ok()) return s;
  const size_t vocab = static_cast<size_t>(base_->config().vocab_size);
  std::vector<int32_t> drawn;
  for (size_t r = 0; r < rows.size(); ++r) {
    sampling::SamplingParams p;
    p.temperature = rows[r].temperature;
    p.top_k = rows[r].top_k;
    p.top_p = rows[r].top_p;
    p.min_p = rows[r].min_p;
    p.seed = rows[r].seed;
    absl::StatusOr<sampling::SampleResult> result =
        sampling::Sample(absl::MakeConstSpan(logits).subspan(r * vocab, vocab), p,
                         sampling::TokenCounts(), rows[r].position);
    drawn.push_back(result.ok() ? result->token : -1);  // -1: the device's "no token"
  }
  last_drawn_ = drawn;
  queued_.push_back({++steps_, std::move(drawn)});
  Log(absl::StrCat("submit ", steps_));
  return absl::OkStatus();
}

absl::Status AsyncTestRunner::CollectSample(std::vector<int32_t>* tokens) {
  if (queued_.empty()) return absl::FailedPreconditionError("no submitted step to collect");
  Queued step = std::move(queued_.front());
  queued_.pop_front();
  Log(absl::StrCat("collect ", step.step));
  if (step.step == fail_collect_) {
    return absl::InternalError(absl::StrCat("step ", step.step, " failed on the device"));
  }
  *tokens = std::move(step.tokens);
  return absl::OkStatus();
}

}  // namespace tessera::engine
