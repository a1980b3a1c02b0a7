#include "worker/parallel/tensor_parallel_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::parallel {

absl::StatusOr<std::unique_ptr<TensorParallelRunner>> TensorParallelRunner::Create(
    const model::LoadedModel* model, TensorParallelOptions options) {
  const int n = options.tensor_parallel_size;
  if (auto s = CheckTensorParallel(model->config, n); !s.ok()) return s;
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
    auto plan = PlanShard(model->config, r, n);
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
  {
    absl::MutexLock lock(&tp->mu_);
    tp->status_.assign(n, absl::OkStatus());
  }
  for (int r = 1; r < n; ++r) tp->threads_.emplace_back([p = tp.get(), r] { p->RankLoop(r); });
  return tp;
}

TensorParallelRunner::~TensorParallelRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void TensorParallelRunner::RankLoop(int rank) {
  int64_t seen = 0;
  std::vector<float> unused_logits;  // only rank 0 receives logits
  for (;;) {
    const runner::ForwardBatch* batch;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && step_ == seen) cv_.Wait(&mu_);
      if (stop_) return;
      seen = step_;
      batch = batch_;
    }
    absl::Status s = ranks_[rank]->Forward(*batch, &unused_logits);
    absl::MutexLock lock(&mu_);
    status_[rank] = std::move(s);
    if (--pending_ == 0) cv_.SignalAll();
  }
}

absl::Status TensorParallelRunner::Forward(const runner::ForwardBatch& batch,
                                           std::vector<float>* logits) {
  {
    absl::MutexLock lock(&mu_);
    batch_ = &batch;
    pending_ = size() - 1;
    ++step_;
    cv_.SignalAll();
  }
  absl::Status s = ranks_[0]->Forward(batch, logits);
  absl::MutexLock lock(&mu_);
  while (pending_ > 0) cv_.Wait(&mu_);
  batch_ = nullptr;
  if (!s.ok()) return s;
  for (int r = 1; r < size(); ++r) {
    if (!status_[r].ok()) {
      return absl::Status(status_[r].code(), absl::StrCat("rank ", r, ": ", status_[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::parallel
