#include "worker/runner/cuda/cuda_moe_block.h"

#include <vector>

#include "base/status_macros.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/moe_routing.h"
#include "worker/runner/cpu_mlp_block.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;

// ids, weights of every token of the step, routed in fp32 from the
// residual (kernels/cuda/moe_router.h).
absl::Status Route(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe,
                   const float* post_norm) {
  const int64_t T = plan.tokens, H = c.config->hidden_size, E = moe.router.out;
  const float eps = static_cast<float>(c.config->rms_norm_eps);
  const float* residual = c.act->residual.as<float>();
  float* logits = c.act->router_logits.as<float>();
  int32_t* ids = c.act->moe_ids.as<int32_t>();
  float* weights = c.act->moe_weights.as<float>();
  if (T <= kcu::kMoeFusedRouterMaxTokens) {
    kcu::MoeRouterArgs a;
    a.residual = residual;
    a.norm = post_norm;
    a.eps = eps;
    a.num_tokens = T;
    a.hidden = H;
    a.router = moe.router.w();
    a.routing = moe.routing;
    a.logits = logits;
    a.counters = c.act->router_counters.as<int32_t>();
    a.experts = ids;
    a.weights = weights;
    return kcu::MoeRouteFromResidual(a, c.stream);
  }
  Bf16* split = c.act->router_split.as<Bf16>();
  RETURN_IF_ERROR(kcu::MoeRouterSplitInput(residual, post_norm, eps, T, H, split, c.stream));
  RETURN_IF_ERROR(c.gemm->Gemm(split, 2 * T, H, moe.router.w(), E, nullptr, logits, c.stream));
  return kcu::MoeRoute(logits, T, moe.routing, ids, weights, c.stream, logits + T * E);
}

// The step's routing, read back for the test observer (eager steps only).
// The logits it reports are the routed ones: both halves summed for long
// steps.
absl::Status Observe(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe,
                     int layer) {
  const int64_t T = plan.tokens, E = moe.router.out, k = moe.routing.top_k;
  std::vector<float> logits(2 * T * E), weights(T * k);
  std::vector<int32_t> ids(T * k);
  RETURN_IF_ERROR(kcu::Synchronize(c.stream));
  RETURN_IF_ERROR(
      kcu::CopyToHost(logits.data(), c.act->router_logits.data(), logits.size() * sizeof(float)));
  RETURN_IF_ERROR(kcu::CopyToHost(ids.data(), c.act->moe_ids.data(), ids.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(
      kcu::CopyToHost(weights.data(), c.act->moe_weights.data(), weights.size() * sizeof(float)));
  if (T > kcu::kMoeFusedRouterMaxTokens) {
    for (int64_t i = 0; i < T * E; ++i) logits[i] += logits[T * E + i];
  }
  logits.resize(T * E);
  c.routing_observer->OnRouting(layer, T, static_cast<int>(k), logits, ids, weights);
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeBlock(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe,
                      const kcu::DeviceBuffer& post_norm, int layer) {
  const int64_t T = plan.tokens, H = c.config->hidden_size;
  const Bf16* xb = c.act->xb.as<Bf16>();
  RETURN_IF_ERROR(Route(c, plan, moe, post_norm.as<float>()));
  if (c.routing_observer != nullptr) RETURN_IF_ERROR(Observe(c, plan, moe, layer));
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
  a.ids = c.act->moe_ids.as<int32_t>();
  a.weights = c.act->moe_weights.as<float>();
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
