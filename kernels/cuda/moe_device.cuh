// Device helpers shared by the MoE GEMV and combine kernels (moe_gemv.cu,
// moe_pair_gemv.cu, moe_combine.cu): bf16 unpacking and dot products in
// one fixed order (so that the kernels that compute the same row agree
// bit for bit), the weight/input loads, and a token's pairs in ascending
// expert order (the order of every combine). Included by .cu files.
//
// Thread-safety: pure device functions.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda::moe_detail {

__device__ __forceinline__ float RoundBf16(float v) { return Bf16BitsToFloat(FloatToBf16Bits(v)); }

// The 8 bf16 of a 16-byte vector as floats (unpacked once, then reused for
// every row of a pass: the conversions cost as much as the FMAs).
__device__ __forceinline__ void Unpack8(uint4 v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// sum + dot(w, x) over 8 values, in element order.
__device__ __forceinline__ float Dot8(float sum, const float (&w)[8], const float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) sum = fmaf(w[i], x[i], sum);
  return sum;
}

// Weights are streamed (evict-first); inputs (x, act rows) are small and
// shared by many warps, so they stay cached.
__device__ __forceinline__ uint4 LoadWeight(const Bf16* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 LoadInput(const Bf16* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// One (token, slot) pair of a combine: the row holding its expert output,
// its routing weight and its expert id.
struct OrderedPair {
  int32_t row;
  float weight;
  int32_t expert;
};

// The pairs of token `t` whose row (row_of(j), j < top_k) is >= 0, in
// ascending expert id (insertion sort: top_k <= kMoeMaxTopK). Returns how
// many. One thread.
template <class RowOf>
__device__ __forceinline__ int OrderTokenPairs(const int32_t* ids, const float* weights, int top_k,
                                               int64_t t, RowOf row_of, OrderedPair* out) {
  int n = 0;
  for (int j = 0; j < top_k; ++j) {
    const int32_t row = row_of(j);
    if (row < 0) continue;
    const OrderedPair pair{row, weights[t * top_k + j], ids[t * top_k + j]};
    int i = n++;
    for (; i > 0 && out[i - 1].expert > pair.expert; --i) out[i] = out[i - 1];
    out[i] = pair;
  }
  return n;
}

}  // namespace tessera::kernels::cuda::moe_detail
