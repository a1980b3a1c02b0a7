#include "worker/parallel/tensor_parallel_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::parallel {

absl::StatusOr<std::unique_ptr<TensorParallelRunner>> TensorParallelRunner::Create(
    const model::LoadedModel* model, TensorParallelOptions options) {
  const int n = options.tensor_parallel_size;
  if (auto s = CheckTensorParallel(model->config, n, options.moe_parallelism); !s.ok()) return s;
  if (options.rank.shard || options.rank.collectives) {
    return absl::InvalidArgumentError(
        "TensorParallelOptions::rank must not set shard or collectives; the runner assigns them");
  }
  const kernels::CpuKernels& kernels =
      options.rank.kernels ? *options.rank.kernels : kernels::OptimizedCpuKernels();
  std::unique_ptr<TensorParallelRunner> tp(new TensorParallelRunner());
  tp->group_ = std::make_unique<InProcessGroup>(n, kernels.reduce_sum);
  int threads = options.rank.num_threads;
  if (threads <= 0) threads = std::max(1, kernels::cpu::ThreadPool::DefaultThreadCount() / n);
  for (int r = 0; r < n; ++r) {
    auto plan = PlanShard(model->config, r, n, options.moe_parallelism);
    if (!plan.ok()) return plan.status();
    runner::CpuRunnerOptions ro = options.rank;
    ro.kernels = &kernels;
    ro.num_threads = threads;
    ro.shard = *plan;
    ro.collectives = tp->group_->rank(r);
    auto rank = runner::CpuModelRunner::Create(model, ro);
    if (!rank.ok()) {
      return absl::Status(rank.status().code(),
                          absl::StrCat(plan->ToString(), ": ", rank.status().message()));
    }
    tp->ranks_.push_back(std::move(*rank));
  }
  tp->unused_logits_.resize(n);
  TensorParallelRunner* self = tp.get();
  tp->lockstep_ = std::make_unique<LockstepRanks>(n, [self](int r) {
    return self->ranks_[r]->Forward(*self->batch_,
                                    r == 0 ? self->logits_ : &self->unused_logits_[r]);
  });
  return tp;
}

TensorParallelRunner::~TensorParallelRunner() { lockstep_.reset(); }

absl::Status TensorParallelRunner::Forward(const runner::ForwardBatch& batch,
                                           std::vector<float>* logits) {
  batch_ = &batch;
  logits_ = logits;
  absl::Status s = lockstep_->Run();
  batch_ = nullptr;
  logits_ = nullptr;
  return s;
}

}  // namespace tessera::parallel
