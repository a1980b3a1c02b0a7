// CpuMlpBlock: the feed-forward block of one decoder layer on the CPU
// kernels, the seam between the layer and its MLP kind:
//   dense:  out = down(silu(gate(x)) * up(x))              (SwiGLU, + biases)
//   MoE:    logits = x . router^T;  experts, weights = route(logits)
//           out = sum of the chosen experts' SwiGLU(x) x weight   (fp32)
//                 + shared_experts(x)                     (GLM-4.5, when any)
// Routing and the expert MLPs go through the registry's kMoeRouting and
// kMoeExperts entries (kernels/cpu/moe_routing.h, moe_experts.h); the
// router GEMM and the SwiGLU parts through kGemm and kSiluMul.
//
// Sharded (worker/parallel/shard_plan.h): a rank holds its slice of the
// dense MLP and of the shared experts, and either a slice of every expert
// (tensor-parallel) or whole experts (expert-parallel); Run() then writes
// the rank's partial sum, which the caller all-reduces. Every rank routes
// every token with the whole router, so the ranks agree on the choices.
//
// Thread-safety: Run() is const and reentrant given distinct scratch and
// output buffers; kernels use the context's pool.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu_backend.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cpu_linear.h"
#include "worker/runner/cpu_weight_loader.h"

namespace tessera::runner {

// Buffers the MLP blocks of one forward step share; grown as needed.
struct MlpScratch {
  std::vector<float> gate_up, act;    // SwiGLU intermediates
  std::vector<float> router_logits;   // [n, E]
  std::vector<int32_t> expert_ids;    // [n, top_k]
  std::vector<float> expert_weights;  // [n, top_k]
  std::vector<float> shared_out;      // [n, H]
};

// Sees what each sparse layer's router chose, for tests and tracing: called
// once per sparse layer and step with the step's tokens in batch order.
class MoeRoutingObserver {
 public:
  virtual ~MoeRoutingObserver() = default;
  virtual void OnRouting(int layer, int64_t num_tokens, int top_k,
                         absl::Span<const float> router_logits, absl::Span<const int32_t> experts,
                         absl::Span<const float> weights) = 0;
};

class CpuMlpBlock {
 public:
  // Layer `layer`'s block as rank `plan` holds it; matrices via `loader`,
  // which must outlive the block.
  static absl::StatusOr<CpuMlpBlock> Prepare(const model::ModelConfig& config, int layer,
                                             const model::LayerWeights& weights,
                                             const parallel::ShardPlan& plan,
                                             CpuWeightLoader* loader);

  // out [n, H] = this rank's share of the block's output for x [n, H].
  // REQUIRES: out does not overlap x.
  void Run(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
           int64_t n, MlpScratch* scratch, float* out, MoeRoutingObserver* observer) const;

  bool sparse() const { return moe_.has_value(); }

 private:
  struct SwiGlu {
    CpuLinear gate_up, down;                     // [2W, H], [H, W]; dense or FP8
    std::vector<float> gate_up_bias, down_bias;  // empty = none
    int64_t width = 0;                           // W on this rank
    void Run(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
             int64_t n, MlpScratch* scratch, float* out) const;
  };
  struct Moe {
    kernels::cpu::WeightMatrix router;                // [E, H]
    std::vector<float> correction_bias;               // [E] or empty
    kernels::cpu::MoeRoutingParams routing;           // correction_bias set per call
    std::vector<kernels::cpu::WeightMatrix> gate_up;  // held experts: [2J, H]
    std::vector<kernels::cpu::WeightMatrix> down;     // held experts: [H, J]
    int32_t first_expert = 0;
    std::optional<SwiGlu> shared;
  };
  static absl::StatusOr<SwiGlu> PrepareSwiGlu(const model::ModelConfig& config,
                                              const model::LayerWeights& layer,
                                              const model::TensorView& gate,
                                              const model::TensorView& up,
                                              const model::TensorView& down, parallel::Range rows,
                                              CpuWeightLoader* loader);
  static absl::StatusOr<Moe> PrepareMoe(const model::ModelConfig& config,
                                        const model::LayerWeights& layer,
                                        const parallel::ShardPlan& plan, CpuWeightLoader* loader);
  void RunMoe(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
              int64_t n, MlpScratch* scratch, float* out, MoeRoutingObserver* observer) const;

  int layer_ = 0;
  int64_t hidden_ = 0;
  std::optional<SwiGlu> dense_;
  std::optional<Moe> moe_;
};

}  // namespace tessera::runner
