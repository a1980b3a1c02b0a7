// MoE combine (moe_combine.h): one CTA per token. Thread 0 orders the
// token's held pairs by expert id (moe_detail::OrderTokenPairs); then
// every thread sums 8 columns at a time over them.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_device.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct CombineKernelArgs {
  const Bf16* y;
  const int32_t* ids;
  const float* weights;
  const int32_t* pair_row;
  const Bf16* shared;
  int top_k;
  int64_t hidden;
  Bf16* out;
};

__device__ __forceinline__ void AddScaled(float (&acc)[8], float w, uint4 v) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] = fmaf(w, __uint_as_float(u[i] << 16), acc[2 * i]);
    acc[2 * i + 1] = fmaf(w, __uint_as_float(u[i] & 0xffff0000u), acc[2 * i + 1]);
  }
}

__global__ void __launch_bounds__(kThreads) MoeCombineKernel(CombineKernelArgs a) {
  __shared__ moe_detail::OrderedPair pairs[kMoeMaxTopK];
  __shared__ int count;
  if (threadIdx.x == 0) {
    const int32_t* pair_row = a.pair_row + static_cast<int64_t>(blockIdx.x) * a.top_k;
    count = moe_detail::OrderTokenPairs(
        a.ids, a.weights, a.top_k, blockIdx.x, [&](int j) { return pair_row[j]; }, pairs);
  }
  __syncthreads();
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x * 8; c < a.hidden; c += kThreads * 8) {
    float acc[8] = {};
    for (int i = 0; i < count; ++i) {
      AddScaled(acc, pairs[i].weight,
                *reinterpret_cast<const uint4*>(a.y + pairs[i].row * a.hidden + c));
    }
    if (a.shared != nullptr) {
      AddScaled(acc, 1.0f, *reinterpret_cast<const uint4*>(a.shared + t * a.hidden + c));
    }
    uint4 o;
    uint32_t* ou = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ou[i] = static_cast<uint32_t>(FloatToBf16Bits(acc[2 * i])) |
              (static_cast<uint32_t>(FloatToBf16Bits(acc[2 * i + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(a.out + t * a.hidden + c) = o;
  }
}

}  // namespace

absl::Status MoeCombine(const MoeCombineArgs& a, CudaStream stream) {
  if (a.groups == nullptr || a.groups->top_k < 1 || a.groups->top_k > kMoeMaxTopK) {
    return absl::InvalidArgumentError("MoeCombine: groups unset or top_k out of range");
  }
  if (a.num_tokens < 0 || a.num_tokens > a.groups->max_tokens || a.num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MoeCombine: num_tokens = ", a.num_tokens,
                                                   " outside [0, ", a.groups->max_tokens, "]"));
  }
  if (a.hidden <= 0 || a.hidden % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeCombine: hidden = ", a.hidden, " must be a positive multiple of 8"));
  }
  if (a.num_tokens == 0) return absl::OkStatus();
  if (a.y == nullptr || a.ids == nullptr || a.weights == nullptr || a.out == nullptr ||
      !Aligned(a.y, 16) || !Aligned(a.out, 16) || (a.shared != nullptr && !Aligned(a.shared, 16))) {
    return absl::InvalidArgumentError("MoeCombine: buffers unset or not 16-byte aligned");
  }
  const CombineKernelArgs k{a.y,      a.ids,           a.weights, a.groups->pair_row,
                            a.shared, a.groups->top_k, a.hidden,  a.out};
  MoeCombineKernel<<<static_cast<unsigned>(a.num_tokens), kThreads, 0, AsCuda(stream)>>>(k);
  return CheckLastLaunch("MoeCombine");
}

}  // namespace tessera::kernels::cuda
