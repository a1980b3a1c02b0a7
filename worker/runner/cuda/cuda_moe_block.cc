#include "worker/runner/cuda/cuda_moe_block.h"

#include "base/status_macros.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_routing.h"

namespace tessera::runner {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;

absl::Status MoeBlock(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe) {
  const int64_t T = plan.tokens, H = c.config->hidden_size;
  const Bf16* xb = c.act->xb.as<Bf16>();
  float* logits = c.act->router_logits.as<float>();
  int32_t* ids = c.act->moe_ids.as<int32_t>();
  float* weights = c.act->moe_weights.as<float>();
  RETURN_IF_ERROR(
      c.gemm->Gemm(xb, T, H, moe.router.w(), moe.router.out, nullptr, logits, c.stream));
  RETURN_IF_ERROR(kcu::MoeRoute(logits, T, moe.routing, ids, weights, c.stream));
  const Bf16* shared = nullptr;
  if (moe.has_shared()) {
    Bf16* out = c.act->shared_out.as<Bf16>();
    RETURN_IF_ERROR(DenseMlp(c, plan, moe.shared_gate_up, moe.shared_down, moe.shared_inter,
                             plan.shared_gate_up_silu_in_gemv, out));
    shared = out;
  }
  kcu::MoeExpertsArgs a;
  a.x = xb;
  a.num_tokens = T;
  a.ids = ids;
  a.weights = weights;
  a.top_k = moe.routing.top_k;
  a.first_expert = moe.first_expert;
  a.experts = moe.experts(H);
  a.shared = shared;
  a.out = c.act->delta.as<Bf16>();
  a.workspace = c.act->moe_workspace.data();
  a.workspace_bytes = c.act->moe_workspace.size();
  a.max_tokens = c.act->moe_max_tokens;
  return kcu::MoeExperts(a, c.stream);
}

}  // namespace tessera::runner
