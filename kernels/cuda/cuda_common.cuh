// Shared device helpers of the CUDA kernels: error conversion, bf16 <-> fp32,
// vector load types and block reductions. Included only by .cu files.
//
// Thread-safety: pure device/host functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/dependent_launch.cuh"

namespace tessera::kernels::cuda {

// The status of a failed CUDA call. It also takes the error out of the
// runtime's last-error slot, so that a later launch check
// (cudaGetLastError) does not report it again for a kernel that launched
// fine; a sticky error (a faulted context) stays and keeps being reported.
inline absl::Status CudaError(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(std::string(what), ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

#define TESSERA_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                      \
    const cudaError_t tessera_cuda_err_ = (expr);                           \
    if (tessera_cuda_err_ != cudaSuccess)                                   \
      return ::tessera::kernels::cuda::CudaError(tessera_cuda_err_, #expr); \
  } while (0)

inline cudaStream_t AsCuda(CudaStream s) { return reinterpret_cast<cudaStream_t>(s); }

// Launch-status check shared by the op wrappers.
absl::Status CheckLastLaunch(std::string_view what);

// The GPU's nanosecond clock (%globaltimer; it ticks coarsely), for the
// timeouts of waits on other CTAs, peers or copies.
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// silu(g) * u in fp32, as every SiLU-and-multiply kernel computes it.
__device__ __forceinline__ float SiluTimes(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays a quiet NaN (same as the host F32ToBf16).
__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// RoPE of one pair (x1, x2) of a head (neox / rotate_half) at position
// `pos` with inverse frequency `inv_freq`: lo = x1 cos - x2 sin, hi = x2 cos
// + x1 sin, in fp32, rounded to bf16. The one formula of every kernel that
// rotates (Rope, the qkv GEMV's epilogue, decode attention), so that they
// agree bit for bit; RopeAngle's (cos, sin) may be computed once and
// applied to many pairs with RopeApply.
__device__ __forceinline__ float2 RopeAngle(float pos, float inv_freq) {
  float s, c;
  sincosf(pos * inv_freq, &s, &c);
  return make_float2(c, s);
}
// (Explicit roundings: the compiler may not contract differently in
// different kernels.)
__device__ __forceinline__ void RopeApply(float x1, float x2, float2 cs, uint16_t* lo,
                                          uint16_t* hi) {
  *lo = FloatToBf16Bits(__fmaf_rn(x1, cs.x, -__fmul_rn(x2, cs.y)));
  *hi = FloatToBf16Bits(__fmaf_rn(x2, cs.x, __fmul_rn(x1, cs.y)));
}
__device__ __forceinline__ void RopeRotate(float x1, float x2, float pos, float inv_freq,
                                           uint16_t* lo, uint16_t* hi) {
  RopeApply(x1, x2, RopeAngle(pos, inv_freq), lo, hi);
}

// Qwen3's per-head RMSNorm before RoPE, shared by rope.cu and decode
// attention's DecodeRope so that both normalize bit for bit alike (explicit
// roundings, as for RopeApply): lane l adds the squares of pairs 8l ..
// 8l+7 (feature i and its partner i + head_dim / 2) in order with
// AddPairSquares; the warp's sum of those (WarpSum's tree), given to
// HeadInvRms, makes the head's 1 / rms; feature i is then NormScale(x,
// inv, w[i]).
__device__ __forceinline__ float AddPairSquares(float ss, float x1, float x2) {
  return __fadd_rn(ss, __fmaf_rn(x1, x1, __fmul_rn(x2, x2)));
}
__device__ __forceinline__ float HeadInvRms(float ss, int head_dim, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(head_dim)), eps));
}
__device__ __forceinline__ float NormScale(float x, float inv, float w) {
  return __fmul_rn(__fmul_rn(x, inv), w);
}

// Sum over the block; every thread gets the result. `scratch` holds 32
// values. The tree order is fixed, so results are deterministic.
template <class T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ __forceinline__ T BlockSum(T v, T* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < warps ? scratch[lane] : T(0);
  total = WarpSum(total);
  return total;
}

template <class T>
__device__ __forceinline__ T WarpMax(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

template <class T>
__device__ __forceinline__ T BlockMax(T v, T* scratch, T identity) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T m = lane < warps ? scratch[lane] : identity;
  return WarpMax(m);
}

// (value, index) of the block's largest value, lowest index among ties.
// Each thread passes its own best candidate; every thread gets the result.
struct ValueIndex {
  float value;
  int64_t index;
};

__device__ __forceinline__ bool Better(const ValueIndex& a, const ValueIndex& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ __forceinline__ ValueIndex WarpArgmax(ValueIndex v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ValueIndex other;
    other.value = __shfl_xor_sync(0xffffffffu, v.value, o);
    other.index = __shfl_xor_sync(0xffffffffu, v.index, o);
    if (Better(other, v)) v = other;
  }
  return v;
}

__device__ __forceinline__ ValueIndex BlockArgmax(ValueIndex v, ValueIndex* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpArgmax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  ValueIndex m = lane < warps ? scratch[lane] : ValueIndex{-__int_as_float(0x7f800000), INT64_MAX};
  return WarpArgmax(m);
}

// Exclusive prefix sum over the threads of the block in thread order (fixed
// order: deterministic). `scratch` holds 33 values. Returns the thread's
// exclusive prefix; *total (optional) gets the block total.
template <class T>
__device__ __forceinline__ T BlockExclusiveScan(T v, T* scratch, T* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  T inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T other = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += other;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? scratch[lane] : T(0);
    T winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T other = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += other;
    }
    scratch[lane] = winc - w;  // exclusive prefix of warp totals
    if (lane == 31) scratch[32] = winc;
  }
  __syncthreads();
  const T result = scratch[warp] + inclusive - v;
  if (total != nullptr) *total = scratch[32];
  return result;
}

inline bool Aligned(const void* p, size_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

}  // namespace tessera::kernels::cuda
