// Pair-major MoE decode kernels (moe_pair_gemv.h). Lane sums, their order
// and the roundings are those of moe_gemv.cu and moe_combine.cu (shared
// through moe_device.cuh), so both paths give the same bits.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/moe_pair_gemv.h"

namespace tessera::kernels::cuda {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): this file's device helpers

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStride = 32 * 8;     // elements per warp step
constexpr int kExpertsPerPass = 4;  // down rows of different experts in flight per warp

// The local expert of pair p, or -1 when another rank holds it.
__device__ __forceinline__ int LocalExpert(const MoePairGemvArgs& a, int64_t p) {
  const int32_t e = a.ids[p] - a.first_expert;
  return e >= 0 && e < a.experts.num_experts ? e : -1;
}

// CTA (column block, pair p): warp w computes act[p, 8 * block + w].
__global__ void __launch_bounds__(kThreads) PairGateUpKernel(MoePairGemvArgs a) {
  const int64_t p = blockIdx.y;
  const int expert = LocalExpert(a, p);
  if (expert < 0) return;
  const int64_t H = a.experts.hidden, I = a.experts.inter;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= I) return;
  const int lane = threadIdx.x & 31;
  const Bf16* gate = a.experts.gate_up + (expert * 2 * I + n) * H;
  const Bf16* up = gate + I * H;
  const Bf16* x = a.x + (p / a.top_k) * H;
  float sg = 0.0f, su = 0.0f;
#pragma unroll 2
  for (int64_t k = lane * 8; k < H; k += kStride) {
    float wg[8], wu[8], xv[8];
    Unpack8(LoadWeight(gate + k), wg);
    Unpack8(LoadWeight(up + k), wu);
    Unpack8(LoadInput(x + k), xv);
    sg = Dot8(sg, wg, xv);
    su = Dot8(su, wu, xv);
  }
  const float g = WarpSum(sg), u = WarpSum(su);
  if (lane == 0) a.act[p * I + n] = FloatToBf16Bits(SiluTimes(RoundBf16(g), RoundBf16(u)));
}

// CTA (row block, token t): warp w computes out[t, 8 * block + w] over the
// token's held experts in ascending order, kDownPass at a time, the first
// kDownIters * kStride columns of each loaded before any FMA.
constexpr int kDownIters = 3;

template <int kDownPass>
__global__ void __launch_bounds__(kThreads) PairDownCombineKernel(MoePairGemvArgs a) {
  __shared__ OrderedPair pairs[kMoeMaxTopK];
  __shared__ int count;
  const int64_t t = blockIdx.y;
  const int64_t H = a.experts.hidden, I = a.experts.inter;
  if (threadIdx.x == 0) {
    const int64_t base = t * a.top_k;
    count = OrderTokenPairs(
        a.ids, a.weights, a.top_k, t,
        [&](int j) { return LocalExpert(a, base + j) >= 0 ? static_cast<int32_t>(base + j) : -1; },
        pairs);
  }
  __syncthreads();
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (h >= H) return;
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  for (int i0 = 0; i0 < count; i0 += kDownPass) {
    const int n = min(kDownPass, count - i0);
    const Bf16* w[kDownPass];
    const Bf16* act[kDownPass];
#pragma unroll
    for (int u = 0; u < kDownPass; ++u) {
      const OrderedPair& pair = pairs[i0 + min(u, n - 1)];
      w[u] = a.experts.down + ((pair.expert - a.first_expert) * H + h) * I;
      act[u] = a.act + static_cast<int64_t>(pair.row) * I;
    }
    uint4 wv[kDownPass][kDownIters];
#pragma unroll
    for (int u = 0; u < kDownPass; ++u) {
#pragma unroll
      for (int i = 0; i < kDownIters; ++i) {
        const int64_t k = static_cast<int64_t>(i) * kStride + lane * 8;
        wv[u][i] = u < n && k < I ? LoadWeight(w[u] + k) : uint4{};
      }
    }
    float s[kDownPass] = {};
#pragma unroll
    for (int u = 0; u < kDownPass; ++u) {
#pragma unroll
      for (int i = 0; i < kDownIters; ++i) {
        const int64_t k = static_cast<int64_t>(i) * kStride + lane * 8;
        if (u >= n || k >= I) break;
        float wf[8], av[8];
        Unpack8(wv[u][i], wf);
        Unpack8(LoadInput(act[u] + k), av);
        s[u] = Dot8(s[u], wf, av);
      }
    }
    for (int64_t k = static_cast<int64_t>(kDownIters) * kStride + lane * 8; k < I; k += kStride) {
#pragma unroll
      for (int u = 0; u < kDownPass; ++u) {
        if (u >= n) break;
        float wf[8], av[8];
        Unpack8(LoadWeight(w[u] + k), wf);
        Unpack8(LoadInput(act[u] + k), av);
        s[u] = Dot8(s[u], wf, av);
      }
    }
#pragma unroll
    for (int u = 0; u < kDownPass; ++u) {
      if (u >= n) break;
      acc = fmaf(pairs[i0 + u].weight, RoundBf16(WarpSum(s[u])), acc);
    }
  }
  if (a.shared != nullptr) acc = fmaf(1.0f, Bf16BitsToFloat(a.shared[t * H + h]), acc);
  if (lane == 0) a.out[t * H + h] = FloatToBf16Bits(acc);
}

absl::Status Check(const MoePairGemvArgs& a, absl::string_view what) {
  if (absl::Status s = ValidateMoeExpertWeights(a.experts, what); !s.ok()) return s;
  if (a.top_k < 1 || a.top_k > kMoeMaxTopK || a.num_tokens < 0 || a.num_tokens * a.top_k > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": top_k = ", a.top_k, ", num_tokens = ", a.num_tokens, " (T * k <= 65535)"));
  }
  if (a.num_tokens == 0) return absl::OkStatus();
  if (a.x == nullptr || a.ids == nullptr || a.weights == nullptr || a.act == nullptr ||
      a.out == nullptr || !Aligned(a.x, 16) || !Aligned(a.act, 16)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": buffers unset or not 16-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoePairGemvGateUp(const MoePairGemvArgs& a, CudaStream stream) {
  if (absl::Status s = Check(a, "MoePairGemvGateUp"); !s.ok()) return s;
  if (a.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((a.experts.inter + kWarps - 1) / kWarps),
                  static_cast<unsigned>(a.num_tokens * a.top_k));
  PairGateUpKernel<<<grid, kThreads, 0, AsCuda(stream)>>>(a);
  return CheckLastLaunch("MoePairGemvGateUp");
}

absl::Status MoePairGemvDownCombine(const MoePairGemvArgs& a, CudaStream stream) {
  if (absl::Status s = Check(a, "MoePairGemvDownCombine"); !s.ok()) return s;
  if (a.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((a.experts.hidden + kWarps - 1) / kWarps),
                  static_cast<unsigned>(a.num_tokens));
  PairDownCombineKernel<kExpertsPerPass><<<grid, kThreads, 0, AsCuda(stream)>>>(a);
  return CheckLastLaunch("MoePairGemvDownCombine");
}

}  // namespace tessera::kernels::cuda
