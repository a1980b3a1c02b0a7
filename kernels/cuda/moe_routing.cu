// Device-side MoE routing (moe_routing.h): one CTA per token, the routing
// itself in moe_routing.cuh (shared with the fused router, moe_router.cu).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): this file's device helpers

struct RouteArgs {
  const float* logits;
  const float* addend;
  int64_t num_tokens;
  MoeRoutingParams p;
  int32_t* experts;
  float* weights;
};

__global__ void __launch_bounds__(kMoeRouteThreads) MoeRouteKernel(RouteArgs a) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x;
  const int n = a.p.num_experts, k = a.p.top_k;
  const LogitsRow x{a.logits + t * n, a.addend == nullptr ? nullptr : a.addend + t * n};
  RouteOneToken(x, a.p, smem, a.experts + t * k, a.weights + t * k);
}

}  // namespace

absl::Status ValidateMoeRouting(const MoeRoutingParams& p) {
  if (p.num_experts < 1 || p.num_experts > kMoeRoutingMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_experts = ", p.num_experts,
                                                   " must be in [1, ", kMoeRoutingMaxExperts, "]"));
  }
  if (p.top_k < 1 || p.top_k > p.num_experts || p.top_k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: top_k = ", p.top_k, " must be in [1, min(num_experts, ", kMoeMaxTopK, ")]"));
  }
  if (p.scoring == MoeScoring::kSoftmax) return absl::OkStatus();
  if (p.num_groups < 1 || p.num_experts % p.num_groups != 0 || p.num_experts / p.num_groups < 2) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_groups = ", p.num_groups,
                                                   " must split ", p.num_experts,
                                                   " experts into equal groups of >= 2"));
  }
  if (p.topk_groups < 1 || p.topk_groups > p.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: topk_groups = ", p.topk_groups,
                                                   " must be in [1, ", p.num_groups, "]"));
  }
  if (p.top_k > p.topk_groups * (p.num_experts / p.num_groups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: top_k = ", p.top_k, " exceeds the experts of ", p.topk_groups, " groups"));
  }
  return absl::OkStatus();
}

absl::Status MoeRoute(const float* logits, int64_t num_tokens, const MoeRoutingParams& params,
                      int32_t* experts, float* weights, CudaStream stream, const float* addend) {
  if (absl::Status s = ValidateMoeRouting(params); !s.ok()) return s;
  if (num_tokens < 0 || num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_tokens = ", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (logits == nullptr || experts == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError("MoeRoute: null pointer");
  }
  const size_t smem = sizeof(float) * MoeRouteSmemFloats(params);
  MoeRouteKernel<<<static_cast<unsigned>(num_tokens), kMoeRouteThreads, smem, AsCuda(stream)>>>(
      RouteArgs{logits, addend, num_tokens, params, experts, weights});
  return CheckLastLaunch("MoeRoute");
}

}  // namespace tessera::kernels::cuda
