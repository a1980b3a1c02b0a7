// TensorParallelRunner: a ModelRunner that runs one model as N tensor-parallel
// shards on the CPU, one thread per rank, in lockstep (worker/parallel/
// README.md has the design).
//
// Each rank is a CpuModelRunner built with its ShardPlan (shard_plan.h) and
// the rank's collectives from an InProcessGroup, whose all-reduce sums with
// the kernel the registry chose for the all_reduce op. Forward() hands the
// batch to every rank, runs rank 0 on the calling thread and ranks 1..N-1 on
// their own threads, and returns when all have finished; rank 0 returns the
// gathered logits. Every rank validates the batch before its first
// collective, and identically, so a bad batch is rejected by all of them
// (INVALID_ARGUMENT, nothing computed) and none is left waiting.
//
// Thread-safety: as ModelRunner, not thread-safe (one engine loop owns it);
// the rank threads are internal and live as long as the runner.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/weights.h"
#include "worker/parallel/in_process_group.h"
#include "worker/parallel/lockstep.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/model_runner.h"

namespace tessera::parallel {

struct TensorParallelOptions {
  int tensor_parallel_size = 2;
  // How MoE layers split their routed experts (shard_plan.h).
  MoeParallelism moe_parallelism = MoeParallelism::kTensor;
  // Options every rank's runner gets (block_size, num_kv_blocks, kernels:
  // the registry's choice per op, all_reduce included). num_threads is per
  // rank; 0 = the host's cores divided among the ranks (at least 1).
  // `shard` and `collectives` are filled per rank and must be left unset.
  runner::CpuRunnerOptions rank;
};

class TensorParallelRunner final : public runner::ModelRunner {
 public:
  // Checks that `model` (which must outlive the runner) splits over the
  // ranks (CheckTensorParallel's errors), then loads every rank's shard and
  // starts the rank threads.
  static absl::StatusOr<std::unique_ptr<TensorParallelRunner>> Create(
      const model::LoadedModel* model, TensorParallelOptions options);
  ~TensorParallelRunner() override;

  const model::ModelConfig& config() const override { return ranks_[0]->config(); }
  int block_size() const override { return ranks_[0]->block_size(); }
  int64_t num_kv_blocks() const override { return ranks_[0]->num_kv_blocks(); }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override;

  int size() const { return static_cast<int>(ranks_.size()); }
  const runner::CpuModelRunner& rank(int r) const { return *ranks_[r]; }

 private:
  TensorParallelRunner() = default;

  std::unique_ptr<InProcessGroup> group_;
  std::vector<std::unique_ptr<runner::CpuModelRunner>> ranks_;
  // The step in flight (set before lockstep_->Run()).
  const runner::ForwardBatch* batch_ = nullptr;
  std::vector<float>* logits_ = nullptr;           // rank 0 returns the gathered logits
  std::vector<std::vector<float>> unused_logits_;  // ranks 1..N-1
  std::unique_ptr<LockstepRanks> lockstep_;        // last: its threads go first
};

}  // namespace tessera::parallel
