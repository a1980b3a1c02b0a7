// CudaTensorParallelRunner: one model as N tensor-parallel shards on N GPUs
// of this host, one thread per rank, in lockstep (the CUDA counterpart of
// TensorParallelRunner; the shard plan is the same, worker/parallel/README.md).
//
// Each rank is a CudaModelRunner holding its ShardPlan's slices on its own
// device and stream; the ranks meet in NCCL all-reduces (an NcclGroup made
// with ncclCommInitAll over the devices) after the embedding, every o_proj
// and every down_proj, inside the ranks' CUDA graphs for decode steps. The
// LM head is vocabulary-parallel: for Forward each rank copies its slice of
// the logits to the host, into its columns of the result; ForwardSample and
// ForwardGreedy keep the logits on the GPUs.
//
// Thread-safety: as ModelRunner (one engine loop owns it); rank threads are
// internal and live as long as the runner.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/model/weights.h"
#include "worker/parallel/lockstep.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#include "worker/runner/model_runner.h"

namespace tessera::bench {
class CudaRunnerBenchPeer;
}  // namespace tessera::bench

namespace tessera::kernels::cuda {
class NcclGroup;
class P2pAllReduce;
}  // namespace tessera::kernels::cuda

namespace tessera::parallel {

class CudaTensorParallelRunner final : public runner::ModelRunner {
 public:
  // `devices`: one CUDA device per rank (rank r on devices[r]). With
  // `model` null, each rank's weights come from `weights` (given the
  // rank's plan; benchmarks make random ones); else `model` must outlive
  // the runner. `options.shard`/`nccl`/`p2p` are set per rank;
  // options.all_reduce_backend picks the collective ("nccl" or "p2p").
  static absl::StatusOr<std::unique_ptr<CudaTensorParallelRunner>> Create(
      const model::LoadedModel* model, const model::ModelConfig& config,
      const std::vector<kernels::DeviceDescription>& devices, runner::CudaRunnerOptions options,
      const runner::CudaWeightsFactory& weights = nullptr);
  ~CudaTensorParallelRunner() override;

  const model::ModelConfig& config() const override { return ranks_[0]->config(); }
  int block_size() const override { return ranks_[0]->block_size(); }
  int64_t num_kv_blocks() const override;
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override;

  // Token trees: every rank masks its own heads (true when all ranks do).
  bool SupportsTreeAttention() const override;
  // Each rank copies the slots in its own cache (its kv heads), after the
  // slots are checked against the smallest rank cache.
  absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) override;

  // Sampling on the GPUs: each rank leaves its logits slice on its device;
  // then the rows are split among the ranks (rank r takes rows [R r / N,
  // R (r + 1) / N)), and each rank copies the peers' slices of its rows
  // next to its own (peer to peer, its stream waiting on the GPU for theirs
  // to be written, not the host) and draws their tokens as the one-GPU
  // runner does (kernels/cuda/sampling.h), so only token ids reach the
  // host. A row's draw depends on its seed and position only, so the
  // tokens do not depend on which rank draws it.
  bool SupportsDeviceSampling() const override { return true; }
  absl::Status ForwardSample(const runner::ForwardBatch& batch,
                             absl::Span<const runner::DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override;

  // Greedy tokens of the logits rows without moving logits to the host:
  // each rank finds its slice's best (value, id), the host keeps the
  // largest (ties: the lower id).
  absl::Status ForwardGreedy(const runner::ForwardBatch& batch, std::vector<int32_t>* tokens);

  int size() const { return static_cast<int>(ranks_.size()); }
  const runner::CudaModelRunner& rank(int r) const { return *ranks_[r]; }

  // FAILED_PRECONDITION once the ranks are out of step: an all-reduce gave
  // up waiting for a peer (the p2p all-reduce's bounded wait), or a step
  // failed after the ranks may have made different collective calls (with
  // p2p: checked, the ranks' next calls differ; with NCCL: any failure but a
  // rejected batch). Every later Forward, ForwardSample and ForwardGreedy
  // then returns it without running.
  absl::Status Health() const override;
  // Tests: makes one p2p all-reduce call on `rank` alone, which gives up
  // waiting for its peers after about two seconds and leaves that rank one
  // call ahead (the timeout it counted is cleared, so the next step has to
  // find its own). FAILED_PRECONDITION without the p2p all-reduce.
  absl::Status DesyncAllReduceForTest(int rank);

 private:
  // Times the ranks' decode graphs (tests/bench/cuda_runner_bench_peer.h).
  friend class bench::CudaRunnerBenchPeer;
  CudaTensorParallelRunner() = default;
  // The NCCL group of the ranks' devices and, for `backend` "p2p", the
  // peer-to-peer all-reduce (a group of more than one rank).
  absl::Status CreateCollectives(const std::vector<int>& ordinals, const std::string& backend);
  // One CudaModelRunner per device with its shard plan, sharing one set of
  // GEMM tuning picks.
  absl::Status CreateRanks(const model::LoadedModel* model, const model::ModelConfig& config,
                           const std::vector<kernels::DeviceDescription>& devices,
                           const runner::CudaRunnerOptions& options,
                           const runner::CudaWeightsFactory& weights);
  // Runs rank `r` on the current batch and scatters its logits slice.
  absl::Status RunRank(int r, const runner::ForwardBatch& batch);
  // ForwardSample's second round: rank r's share of sample_rows_.
  absl::Status SampleRank(int r);
  // Hands the batch to every rank and waits for all.
  absl::Status RunAll(const runner::ForwardBatch& batch);
  // After a step (`s`, its result): marks the group out of step where it
  // is (see Health) and returns that instead of `s`.
  absl::Status AfterStep(absl::Status s);
  // Why the ranks are out of step after the failed step `s` ("" when they
  // are not).
  std::string OutOfStep(const absl::Status& s);

  std::unique_ptr<kernels::cuda::NcclGroup> nccl_;
  std::unique_ptr<kernels::cuda::P2pAllReduce> p2p_;  // all_reduce_backend "p2p"
  std::vector<std::unique_ptr<runner::CudaModelRunner>> ranks_;
  std::vector<ShardPlan> plans_;
  std::vector<std::vector<float>> local_logits_;  // per rank
  // The step in flight (set before lockstep_->Run()).
  const runner::ForwardBatch* batch_ = nullptr;
  std::vector<float>* out_ = nullptr;  // logits mode: the result
  bool greedy_ = false;                // ForwardGreedy
  bool on_device_ = false;             // ForwardSample: logits stay on the devices
  bool sampling_ = false;              // ForwardSample's second round
  absl::Span<const runner::DeviceSamplingRow> sample_rows_;
  std::vector<std::vector<int32_t>> sample_tokens_;  // per rank, its rows' tokens
  mutable std::mutex health_mu_;
  absl::Status broken_;                        // Health(); OK until the group falls out of step
  std::vector<std::vector<int32_t>> top_ids_;  // per rank (greedy mode)
  std::vector<std::vector<float>> top_values_;
  std::unique_ptr<LockstepRanks> lockstep_;  // last: its threads go first
};

}  // namespace tessera::parallel
