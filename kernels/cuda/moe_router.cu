// The fp32 MoE router (moe_router.h).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/moe_routing.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): this file's device helpers

constexpr int kWarps = kMoeRouteThreads / 32;
constexpr int kExpertsPerWarp = kMoeRouterExpertsPerCta / kWarps;
constexpr int kStride = 32 * 8;  // elements per warp step
// Router vectors per lane and expert loaded before the wait: the first
// kPrefetch * kStride elements of each row (all of them for H <= 2048).
constexpr int kPrefetch = 8;
static_assert(kExpertsPerWarp * kWarps == kMoeRouterExpertsPerCta);

// x = RMSNorm(row) * norm into x[0, H), fp32: (v * inv_rms) * w, as the
// CPU reference. Every thread of the block calls it; x is complete after.
__device__ __forceinline__ void NormedRow(const float* row, const float* norm, float eps, int64_t H,
                                          float* x, float* red) {
  float ss = 0.0f;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float v = row[h];
    x[h] = v;
    ss = fmaf(v, v, ss);
  }
  const float inv = rsqrtf(BlockSum(ss, red) / static_cast<float>(H) + eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) x[h] = (x[h] * inv) * norm[h];
  __syncthreads();
}

__device__ __forceinline__ void Load8(const float* x, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(x);
  const float4 b = *reinterpret_cast<const float4*>(x + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// CTA (expert block, token t): warp w the logits of experts
// 8 * block + 2w, + 1; then the token's last CTA routes it.
__global__ void __launch_bounds__(kMoeRouteThreads) FusedRouterKernel(MoeRouterArgs a) {
  extern __shared__ __align__(16) float smem[];  // x [H]; then the routing's scores
  __shared__ float red[33];
  __shared__ int last;
  const int64_t t = blockIdx.y, H = a.hidden;
  const int E = a.routing.num_experts, k = a.routing.top_k;
  const int lane = threadIdx.x & 31;
  const int e0 = static_cast<int>(blockIdx.x) * kMoeRouterExpertsPerCta +
                 static_cast<int>(threadIdx.x >> 5) * kExpertsPerWarp;
  // The router rows are constant: loaded before the wait.
  uint4 w[kExpertsPerWarp][kPrefetch];
#pragma unroll
  for (int u = 0; u < kExpertsPerWarp; ++u) {
#pragma unroll
    for (int i = 0; i < kPrefetch; ++i) {
      const int64_t col = static_cast<int64_t>(i) * kStride + lane * 8;
      w[u][i] = e0 + u < E && col < H ? LoadWeight(a.router + (e0 + u) * H + col) : uint4{};
    }
  }
  WaitForPrimary();
  NormedRow(a.residual + t * H, a.norm, a.eps, H, smem, red);
  float s[kExpertsPerWarp] = {};
#pragma unroll
  for (int i = 0; i < kPrefetch; ++i) {
    const int64_t col = static_cast<int64_t>(i) * kStride + lane * 8;
    if (col >= H) break;
    float xv[8];
    Load8(smem + col, xv);
#pragma unroll
    for (int u = 0; u < kExpertsPerWarp; ++u) {
      float wv[8];
      Unpack8(w[u][i], wv);
      s[u] = Dot8(s[u], wv, xv);
    }
  }
  for (int64_t col = static_cast<int64_t>(kPrefetch) * kStride + lane * 8; col < H;
       col += kStride) {
    float xv[8];
    Load8(smem + col, xv);
#pragma unroll
    for (int u = 0; u < kExpertsPerWarp; ++u) {
      if (e0 + u >= E) break;
      float wv[8];
      Unpack8(LoadWeight(a.router + (e0 + u) * H + col), wv);
      s[u] = Dot8(s[u], wv, xv);
    }
  }
#pragma unroll
  for (int u = 0; u < kExpertsPerWarp; ++u) {
    const float v = WarpSum(s[u]);
    if (lane == 0 && e0 + u < E) a.logits[t * E + e0 + u] = v;
  }
  // Every thread is done with x (smem is reused by the routing below).
  __threadfence();
  __syncthreads();
  if (gridDim.x > 1) {
    if (threadIdx.x == 0) {
      last = atomicAdd(a.counters + t, 1) + 1 == static_cast<int>(gridDim.x);
      if (last) a.counters[t] = 0;  // zero again for the next call
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
  }
  RouteOneToken(LogitsRow{a.logits + t * E, nullptr}, a.routing, smem, a.experts + t * k,
                a.weights + t * k);
}

// One CTA per token: the hi/lo halves of x.
__global__ void __launch_bounds__(256) SplitKernel(const float* residual, const float* norm,
                                                   float eps, int64_t T, int64_t H, Bf16* split) {
  extern __shared__ __align__(16) float x[];
  __shared__ float red[33];
  const int64_t t = blockIdx.x;
  NormedRow(residual + t * H, norm, eps, H, x, red);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const uint16_t hi = FloatToBf16Bits(x[h]);
    split[t * H + h] = hi;
    split[(T + t) * H + h] = FloatToBf16Bits(x[h] - Bf16BitsToFloat(hi));
  }
}

absl::Status CheckRow(const float* residual, const float* norm, int64_t hidden,
                      absl::string_view what) {
  if (hidden <= 0 || hidden % 8 != 0 || hidden > kMoeRouterMaxHidden) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": hidden = ", hidden, " must be a positive multiple of 8 <= ", kMoeRouterMaxHidden));
  }
  if (residual == nullptr || norm == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": residual or norm unset"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRouteFromResidual(const MoeRouterArgs& a, CudaStream stream) {
  if (absl::Status s = ValidateMoeRouting(a.routing); !s.ok()) return s;
  if (absl::Status s = CheckRow(a.residual, a.norm, a.hidden, "MoeRouteFromResidual"); !s.ok()) {
    return s;
  }
  if (a.num_tokens < 0 || a.num_tokens > kMoeFusedRouterMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeRouteFromResidual: num_tokens = ", a.num_tokens, " outside [0, ",
                     kMoeFusedRouterMaxTokens, "]"));
  }
  if (a.num_tokens == 0) return absl::OkStatus();
  const int blocks =
      (a.routing.num_experts + kMoeRouterExpertsPerCta - 1) / kMoeRouterExpertsPerCta;
  if (a.router == nullptr || !Aligned(a.router, 16) || a.logits == nullptr ||
      a.experts == nullptr || a.weights == nullptr || (blocks > 1 && a.counters == nullptr)) {
    return absl::InvalidArgumentError(
        "MoeRouteFromResidual: router (16-byte aligned), logits, experts, weights and (for "
        "more than 8 experts) counters must be set");
  }
  const size_t smem = sizeof(float) * std::max<size_t>(static_cast<size_t>(a.hidden),
                                                       MoeRouteSmemFloats(a.routing));
  if (smem > 48 * 1024) {
    return absl::InvalidArgumentError("MoeRouteFromResidual: more than 48 KB of shared memory");
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.num_tokens));
  TESSERA_CUDA_RETURN_IF_ERROR(LaunchDependentIf(a.programmatic && DependentLaunchSupported(),
                                                 FusedRouterKernel, grid, dim3(kMoeRouteThreads),
                                                 smem, AsCuda(stream), a));
  return CheckLastLaunch("MoeRouteFromResidual");
}

absl::Status MoeRouterSplitInput(const float* residual, const float* norm, float eps,
                                 int64_t num_tokens, int64_t hidden, Bf16* split,
                                 CudaStream stream) {
  if (absl::Status s = CheckRow(residual, norm, hidden, "MoeRouterSplitInput"); !s.ok()) return s;
  if (num_tokens < 0 || num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeRouterSplitInput: num_tokens = ", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (split == nullptr) return absl::InvalidArgumentError("MoeRouterSplitInput: split unset");
  SplitKernel<<<static_cast<unsigned>(num_tokens), 256, sizeof(float) * hidden, AsCuda(stream)>>>(
      residual, norm, eps, num_tokens, hidden, split);
  return CheckLastLaunch("MoeRouterSplitInput");
}

}  // namespace tessera::kernels::cuda
