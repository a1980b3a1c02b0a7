// CudaModelRunner: the forward pass of Llama / Mistral / Qwen2 / Qwen3
// decoders and the mixture-of-experts Qwen3-MoE / GLM-4.5 on one CUDA
// device (kernels/cuda), over a paged bf16 KV cache.
//
// The forward pass is the modules of cuda_forward.h (embedding, attention
// block, MLP block, LM head) over the weights of cuda_weights.h, the batch
// staged by staged_batch.h and the paged KV cache of cuda_kv_cache.h; a
// StepPlan decided once per step picks the fused paths.
//
// Decode steps (every sequence one token) run as CUDA graphs
// (decode_graphs.h). A token-tree batch whose chunks are all single tokens
// is such a step (one token attends to its context and itself either way);
// a branching chunk has more than one token, so tree masks never enter a
// graph. Greedy and sampled tokens are drawn on the GPU (device_sampling.h).
//
// Asynchronous steps (SubmitSample / CollectSample, one GPU only): a
// submitted step is staged from pinned memory, its tokens taken from the
// step before (PreviousStepToken) are filled on the device from that step's
// drawn ids (kernels/cuda/token_patch.h) before it runs, eagerly or as its
// decode graph (which reads the ids from the staged buffer), and its draws
// are copied to pinned host memory behind an event; CollectSample waits on
// that event only. At most two steps are submitted and not collected; the
// host staging is double-buffered so step N+1's inputs never overwrite
// step N's while its copy may be queued.
//
// With a shard (CudaRunnerOptions::shard) the runner is one tensor-parallel
// rank (Megatron-style, as worker/parallel/README.md describes for CPU
// ranks), meeting the other ranks through NCCL all-reduces.
//
// Weights are copied to the device once (fp32/fp16 checkpoints converted to
// bf16; q/k/v and gate/up fused). The KV cache takes `num_kv_blocks`, or,
// when 0, `gpu_memory_fraction` of the memory left after weights and
// workspace.
//
// Thread-safety: not thread-safe (one engine loop owns it). Create() makes
// the device current on the calling thread; call Forward from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/model/weights.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cuda/cuda_forward.h"
#include "worker/runner/cuda/cuda_weights.h"
#include "worker/runner/cuda/decode_graphs.h"
#include "worker/runner/cuda/device_sampling.h"
#include "worker/runner/model_runner.h"

namespace tessera::bench {
class CudaRunnerBenchPeer;
}  // namespace tessera::bench

namespace tessera::kernels::cuda {
class GemmTuningTable;
class NcclGroup;
class P2pAllReduce;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

struct CudaRunnerOptions {
  int block_size = 16;
  int64_t num_kv_blocks = 0;         // 0 = from gpu_memory_fraction
  double gpu_memory_fraction = 0.9;  // of the free memory after weights, for the KV cache
  int max_num_tokens = 8192;         // workspace: tokens per Forward
  int max_num_seqs = 256;            // sequences per Forward
  bool cuda_graphs = true;           // decode steps as CUDA graphs
  int max_graph_batch = 128;         // decode batches above this run eagerly
  // Tensor parallelism: this runner is rank shard->rank of a group
  // (worker/parallel/shard_plan.h). It holds that rank's slices (q/KV heads,
  // intermediate rows, vocabulary rows), all-reduces through `nccl` after the
  // embedding, o_proj and down_proj, and Forward() returns the logits of its
  // vocabulary slice only ([rows, shard->vocab.size]); the caller
  // (worker/parallel/cuda_tensor_parallel_runner.h) assembles them. Every
  // rank must run the same batches in lockstep.
  std::optional<parallel::ShardPlan> shard;
  kernels::cuda::NcclGroup* nccl = nullptr;
  // The group's all-reduce, as the registry chose it (kernels/cuda_backend.h):
  // "nccl", or "p2p" = bf16 messages up to kP2pAllReduceMaxBytes through
  // `p2p` (set per rank by the tensor-parallel runner), the rest through
  // `nccl`.
  std::string all_reduce_backend = "nccl";
  kernels::cuda::P2pAllReduce* p2p = nullptr;
  // The first decode step of each batch bucket, before it is captured as a
  // CUDA graph, runs once eagerly with cuBLASLt tuning its shapes
  // (kernels/cuda/gemm.h GemmContext::SetAutotune; the shapes depend on the
  // batch bucket only), so the graphs hold the fastest algorithms;
  // other calls keep cuBLASLt's heuristic choice. On the H200 (gpu_tp_bench,
  // runs with and without it alternating): batch 64 2.5-4% faster on one
  // GPU and 1.4% with TP=2, batch 1 about 1% (its LM head).
  bool gemm_autotune = true;
  // How many of cuBLASLt's heuristic algorithms that tuning times per shape
  // (kernels/cuda/gemm.h GemmContext::SetAutotuneCandidates).
  int gemm_autotune_candidates = 32;
  // Tuning picks shared with the other ranks of a tensor-parallel group
  // (kernels/cuda/gemm.h GemmTuningTable; set by the tensor-parallel
  // runner), so every rank runs the same GEMM kernels.
  std::shared_ptr<kernels::cuda::GemmTuningTable> gemm_tuning;
  // Prefill attention, as the registry chose it (kernels/cuda_backend.h):
  // "cuda" = the portable kernel; "cuda-sm90a" = the wgmma kernel
  // (kernels/cuda/prefill_attention_sm90.h) for the shapes it supports
  // (head_dim 64, 128), the portable one for the rest. Create() fails when
  // "cuda-sm90a" cannot run on the device.
  std::string prefill_attention_backend = "cuda";
  // Tests: told every sparse layer's router logits, chosen experts and
  // weights (worker/runner/cpu_mlp_block.h), read back after each layer's
  // routing (the step synchronises there, so cuda_graphs must be false).
  MoeRoutingObserver* routing_observer = nullptr;
};

class CudaModelRunner final : public ModelRunner {
 public:
  // Uploads the weights of `model` (which must outlive the runner) to
  // `device` (kind kCuda with gpu info; the ordinal is used for this
  // process) and allocates the KV cache and workspace.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const model::LoadedModel* model, const kernels::DeviceDescription& device,
      CudaRunnerOptions options);

  // A runner for `config` whose weights `weights` makes for this rank's
  // plan on `device` (e.g. random values in benchmarks).
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const model::ModelConfig& config, const CudaWeightsFactory& weights,
      const kernels::DeviceDescription& device, CudaRunnerOptions options);

  ~CudaModelRunner() override;

  const model::ModelConfig& config() const override { return config_; }
  int block_size() const override { return options_.block_size; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;

  bool SupportsDeviceSampling() const override;
  // Token trees: Forward accepts ForwardBatch::tree_parents (a branching
  // chunk has at most 64 tokens below its trunk, the chain every token
  // descends from, e.g. the root after the context; its tokens attend
  // through the portable prefill kernel's ancestor masks, INVALID_ARGUMENT
  // for larger trees) and CopyKvSlots compacts the accepted path's K/V.
  bool SupportsTreeAttention() const override { return true; }
  absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) override;
  // SubmitSample then CollectSample; FAILED_PRECONDITION while submitted
  // steps are not collected (their tokens would come back instead).
  absl::Status ForwardSample(const ForwardBatch& batch, absl::Span<const DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override;

  // One GPU only (as SupportsDeviceSampling): a tensor-parallel rank's
  // vocabulary slice cannot draw alone.
  bool SupportsAsyncSampling() const override { return SupportsDeviceSampling(); }
  // ModelRunner's contract. FAILED_PRECONDITION, queuing nothing, when two
  // steps are submitted and not collected already, or on a sharded rank;
  // INVALID_ARGUMENT for a bad batch or `from_previous` entry (outside the
  // batch's tokens or the previous step's rows), or `from_previous` when
  // the step just before was not a SubmitSample that succeeded (a Forward,
  // ForwardGreedy, ForwardTopOne, ForwardToDevice or SampleSlices since
  // replaced the device's drawn ids). A device error is a status here or
  // at CollectSample.
  absl::Status SubmitSample(const ForwardBatch& batch, absl::Span<const DeviceSamplingRow> rows,
                            absl::Span<const PreviousStepToken> from_previous) override;
  absl::Status CollectSample(std::vector<int32_t>* tokens) override;
  // Steps submitted and not collected (0, 1 or 2).
  int steps_in_flight() const;

  // Forward, then the argmax of each logits row on the device; only the
  // token ids come back to the host. One rank (no shard) only.
  absl::Status ForwardGreedy(const ForwardBatch& batch, std::vector<int32_t>* tokens);

  // Forward, then each logits row's maximum over this runner's vocabulary
  // (its slice when sharded) and the token id holding it (ties: lowest id).
  absl::Status ForwardTopOne(const ForwardBatch& batch, std::vector<int32_t>* ids,
                             std::vector<float>* values);

  // Tensor-parallel sampling (CudaTensorParallelRunner::ForwardSample):
  // Forward with the logits rows left on the device, this runner's
  // vocabulary slice at device_logits(), until the next step. It returns
  // once the step is queued, without waiting for the GPU: the slice's
  // `ready` event marks when its rows are written. The caller must not
  // start this runner's next step before every SampleSlices reading the
  // slice has returned (each synchronizes its own stream, which waited for
  // `ready`).
  absl::Status ForwardToDevice(const ForwardBatch& batch);
  using LogitsSlice = runner::LogitsSlice;
  LogitsSlice device_logits() const;
  // On this runner's device: puts the `r` rows of every slice (in
  // vocabulary order, together the whole vocabulary; peers' slices copied
  // peer to peer once their `ready` events have fired) side by side and
  // draws one token per row as ForwardSample does (a single slice on this
  // device, a one-rank group's, is sampled where it is, without a copy);
  // the stream is synchronized when it returns, also for r = 0. A slice's
  // `data` may point into its rows (a tensor-parallel group splits the rows
  // among its ranks). INVALID_ARGUMENT for slices that do not tile the
  // vocabulary or more rows than a step has.
  absl::Status SampleSlices(absl::Span<const LogitsSlice> slices, int64_t r,
                            absl::Span<const DeviceSamplingRow> rows, std::vector<int32_t>* tokens);

  // Bytes of weights on the device.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Decode graphs captured so far.
  int graphs_captured() const { return graphs_.size(); }
  // Eager GEMM-autotuning steps run so far (one per batch bucket).
  int autotune_runs() const { return graphs_.autotune_runs(); }

  // Waits until the work this runner queued on its GPU has ended.
  absl::Status Synchronize();

 private:
  // Times the decode graphs' replays (tests/bench/cuda_runner_bench_peer.h).
  friend class bench::CudaRunnerBenchPeer;
  struct Impl;
  // A step's sizes, read from its batch once.
  struct StepShape {
    int seqs = 0;
    int64_t tokens = 0;
    int64_t logits_rows = 0;
    int max_seq_len = 0;
    int max_query_len = 0;
    bool decode() const { return max_query_len == 1; }
  };
  CudaModelRunner(model::ModelConfig config, CudaRunnerOptions options);
  absl::Status Init(const kernels::DeviceDescription& device);
  absl::Status AllocateCacheAndWorkspace();
  absl::Status AllocateActivations();
  // Router logits, choices, shared-expert output and the experts' workspace
  // (nothing for dense models).
  absl::Status AllocateMoeActivations();
  absl::Status ValidateBatch(const ForwardBatch& batch) const;
  // ValidateBatch and the step's sizes; nothing touches the device.
  absl::StatusOr<StepShape> PrepareStep(const ForwardBatch& batch) const;
  // Refuses `from_previous` entries outside the batch or the previous
  // submitted step's rows.
  absl::Status CheckFromPrevious(const ForwardBatch& batch,
                                 absl::Span<const PreviousStepToken> from_previous) const;
  // Which kernels a step of this shape runs.
  StepPlan PlanStep(int64_t tokens, int seqs, int64_t logits_rows, bool decode, int max_seq_len,
                    int max_query_len, bool tree) const;
  // Runs the model on the staged batch; logits rows land in the logits
  // buffer.
  absl::Status RunModel(const StepPlan& plan);
  // A synchronous-path step (not SubmitSample): PrepareStep, then Execute;
  // the device's drawn ids stop being the previous step's.
  absl::Status Execute(const ForwardBatch& batch, int64_t* num_logits);
  // Stages the batch, fills its `from_previous` tokens from the device's
  // drawn ids, and runs it, eagerly or as a decode graph.
  absl::Status Execute(const ForwardBatch& batch, const StepShape& shape,
                       absl::Span<const PreviousStepToken> from_previous);
  absl::Status RunEager(const ForwardBatch& batch, const StepShape& shape,
                        absl::Span<const PreviousStepToken> from_previous);
  absl::Status RunDecodeGraph(const ForwardBatch& batch, const StepShape& shape,
                              absl::Span<const PreviousStepToken> from_previous);
  // Stages the batch padded as given and fills its previous-step tokens.
  absl::StatusOr<bool> StageStep(const ForwardBatch& batch, int64_t padded_tokens, int padded_seqs,
                                 int context, absl::Span<const PreviousStepToken> from_previous);
  // Grows the decode attention workspace for `seqs` sequences of up to
  // `context` tokens, dropping the captured graphs (they hold the old one).
  absl::Status EnsureDecodeWorkspace(int seqs, int context);
  // The stream every step of this runner is queued on.
  kernels::cuda::CudaStream stream() const;

  model::ModelConfig config_;
  CudaRunnerOptions options_;
  int64_t num_kv_blocks_ = 0;
  int64_t weight_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
  DecodeGraphs graphs_;
  DeviceSampler sampler_;
};

}  // namespace tessera::runner
