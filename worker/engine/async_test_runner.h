// AsyncTestRunner: a ModelRunner for tests of the engine's pipelined steps
// (engine.h). It wraps another runner (CPU, simulated) and adds what an
// asynchronous GPU runner has: sampling where the logits are
// (ForwardSample: each row drawn by the host sampler's own code with the
// row's parameters, so its tokens equal host sampling) and steps as a
// submit/collect pair. A submitted step is computed at once, in submission
// order, but its tokens are only handed out by CollectSample; tokens taken
// from the previous step (runner::PreviousStepToken) are that step's
// draws, as a device would read them. Every call is logged ("submit 3",
// "collect 3", with the step's number) for tests of the order, and a chosen
// collect can be made to fail.
//
// Thread-safety: like every ModelRunner, one engine thread at a time;
// log() may be read from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/runner/model_runner.h"

namespace tessera::engine {

class AsyncTestRunner final : public runner::ModelRunner {
 public:
  explicit AsyncTestRunner(std::unique_ptr<runner::ModelRunner> base) : base_(std::move(base)) {}

  const model::ModelConfig& config() const override { return base_->config(); }
  int block_size() const override { return base_->block_size(); }
  int64_t num_kv_blocks() const override { return base_->num_kv_blocks(); }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override;
  bool SupportsDeviceSampling() const override { return true; }
  bool SupportsAsyncSampling() const override { return true; }
  absl::Status ForwardSample(const runner::ForwardBatch& batch,
                             absl::Span<const runner::DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override;
  absl::Status SubmitSample(const runner::ForwardBatch& batch,
                            absl::Span<const runner::DeviceSamplingRow> rows,
                            absl::Span<const runner::PreviousStepToken> from_previous) override;
  absl::Status CollectSample(std::vector<int32_t>* tokens) override;
  absl::Status Health() const override { return base_->Health(); }

  // The calls so far, oldest first: "forward N" (a synchronous Forward),
  // "submit N", "collect N", where N numbers the steps from 1.
  std::vector<std::string> log() const;
  // The collect of step `step` fails with INTERNAL (its tokens are lost).
  void FailCollectOf(int step) { fail_collect_ = step; }
  // Submitted steps not collected (at most 2).
  int in_flight() const { return static_cast<int>(queued_.size()); }

 private:
  struct Queued {
    int step = 0;
    std::vector<int32_t> tokens;
  };
  void Log(std::string entry);

  std::unique_ptr<runner::ModelRunner> base_;
  int steps_ = 0;
  int fail_collect_ = 0;
  std::deque<Queued> queued_;
  std::vector<int32_t> last_drawn_;  // the previous submitted step's draws
  mutable absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::engine
