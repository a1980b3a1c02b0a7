#include <cuda_fp8.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_gemv.h"

namespace tessera::kernels::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;  // as kernels/cpu/fp8_linear.cc
constexpr int kQuantThreads = 128;
constexpr int kGemvWarps = 8;

__device__ __forceinline__ uint8_t ToE4m3(float x, float scale) {
  const float q = fminf(fmaxf(__fdiv_rn(x, scale), -kE4m3Max), kE4m3Max);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// One CTA per (token, group): the group's amax, then its e4m3 values.
__global__ void QuantizeKernel(const __nv_bfloat16* __restrict__ x, int k, int group,
                               const float* __restrict__ static_scale, uint8_t* __restrict__ xq,
                               float* __restrict__ xs, int groups) {
  const int t = blockIdx.y, g = blockIdx.x;
  const int start = g * group, end = min(k, start + group);
  const __nv_bfloat16* row = x + static_cast<int64_t>(t) * k;
  __shared__ float warp_max[kQuantThreads / 32];
  __shared__ float scale_shared;
  float scale;
  if (static_scale != nullptr) {
    scale = *static_scale;
  } else {
    float amax = 0.f;
    for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
      amax = fmaxf(amax, fabsf(__bfloat162float(row[i])));
    }
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, off));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.f;
      for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
      scale_shared = __fdiv_rn(fmaxf(m, kAmaxFloor), kE4m3Max);
    }
    __syncthreads();
    scale = scale_shared;
  }
  for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
    xq[static_cast<int64_t>(t) * k + i] = ToE4m3(__bfloat162float(row[i]), scale);
  }
  if (threadIdx.x == 0) xs[t * groups + g] = scale;
}

__device__ __forceinline__ float2 E4m3PairToFloat2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// sum of the 16 products of two 16-byte vectors of e4m3 values.
__device__ __forceinline__ float Dot16(const uint4& a, const uint4& b) {
  const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x = E4m3PairToFloat2(static_cast<uint16_t>(av[i] >> (16 * h)));
      const float2 w = E4m3PairToFloat2(static_cast<uint16_t>(bv[i] >> (16 * h)));
      s = fmaf(x.x, w.x, s);
      s = fmaf(x.y, w.y, s);
    }
  }
  return s;
}

__device__ __forceinline__ uint4 LoadStreaming(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp per output row; lanes 8c..8c+7 cover chunk c (128 features) of
// each 512-feature step, 16 features per lane.
template <int M>
__global__ void __launch_bounds__(kGemvWarps * 32)
    Fp8GemvKernel(const uint8_t* __restrict__ xq, const float* __restrict__ xs, int group,
                  int xs_cols, const uint8_t* __restrict__ w, int n, int k,
                  const float* __restrict__ ws, int row_block, int block, int ws_cols,
                  const float* __restrict__ bias, __nv_bfloat16* __restrict__ y, int ldy) {
  const int lane = threadIdx.x & 31;
  const int o = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (o >= n) return;
  const int sub = lane & 7, chunk = lane >> 3;
  const uint8_t* wrow = w + static_cast<int64_t>(o) * k;
  const float* wscale = ws + static_cast<int64_t>(o / row_block) * ws_cols;
  float acc[M];
#pragma unroll
  for (int t = 0; t < M; ++t) acc[t] = 0.f;
  for (int k0 = 0; k0 < k; k0 += 512) {
    const int chunk_start = k0 + chunk * 128;
    const int kk = chunk_start + sub * 16;
    const bool valid = kk < k;
    const uint4 wv = valid ? LoadStreaming(wrow + kk) : make_uint4(0, 0, 0, 0);
    float p[M];
#pragma unroll
    for (int t = 0; t < M; ++t) {
      const uint4 xv =
          valid ? __ldg(reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(t) * k + kk))
                : make_uint4(0, 0, 0, 0);
      p[t] = Dot16(xv, wv);
    }
    // The chunk's partial sum over its 8 lanes, then each scale once.
#pragma unroll
    for (int t = 0; t < M; ++t) {
      p[t] += __shfl_xor_sync(~0u, p[t], 1);
      p[t] += __shfl_xor_sync(~0u, p[t], 2);
      p[t] += __shfl_xor_sync(~0u, p[t], 4);
    }
    if (sub == 0 && chunk_start < k) {
      const float wsv = wscale[chunk_start / block];
#pragma unroll
      for (int t = 0; t < M; ++t) acc[t] += p[t] * xs[t * xs_cols + chunk_start / group] * wsv;
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    acc[t] += __shfl_xor_sync(~0u, acc[t], 8);
    acc[t] += __shfl_xor_sync(~0u, acc[t], 16);
  }
  if (lane == 0) {
    const float b = bias != nullptr ? bias[o] : 0.f;
#pragma unroll
    for (int t = 0; t < M; ++t) y[static_cast<int64_t>(t) * ldy + o] = __float2bfloat16(acc[t] + b);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool GroupOk(int64_t group, int64_t k) { return group == kFp8Block || group == k; }

}  // namespace

absl::Status Fp8QuantizeActivations(const Bf16* x, int64_t m, int64_t k,
                                    const Fp8ActivationQuant& quant, uint8_t* xq, float* xs,
                                    CudaStream stream) {
  if (x == nullptr || xq == nullptr || xs == nullptr || m < 1 || k < 1 || m > 65535 ||
      k > (int64_t{1} << 30) || !GroupOk(quant.group, k)) {
    return absl::InvalidArgumentError(absl::StrCat("Fp8QuantizeActivations: bad arguments (m ", m,
                                                   ", k ", k, ", group ", quant.group, ")"));
  }
  const int groups = static_cast<int>((k + quant.group - 1) / quant.group);
  QuantizeKernel<<<dim3(groups, static_cast<unsigned>(m)), kQuantThreads, 0, AsCuda(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), static_cast<int>(k), static_cast<int>(quant.group),
      quant.static_scale, xq, xs, groups);
  return CheckLastLaunch("Fp8QuantizeActivations");
}

bool Fp8GemvApplicable(int64_t m, int64_t k, const uint8_t* xq, const Fp8DeviceWeight& w,
                       int64_t group) {
  return m >= 1 && m <= kFp8GemvMaxRows && k == w.k && k % 16 == 0 && k <= (int64_t{1} << 30) &&
         w.n >= 1 && w.n <= (int64_t{1} << 30) && Aligned16(xq) && Aligned16(w.data) &&
         w.scales != nullptr && w.row_block >= 1 && (w.block == kFp8Block || w.block == k) &&
         GroupOk(group, k);
}

absl::Status Fp8GemvBf16(const uint8_t* xq, const float* xs, int64_t m, int64_t group,
                         const Fp8DeviceWeight& w, const float* bias, Bf16* y, int64_t ldy,
                         CudaStream stream) {
  if (!Fp8GemvApplicable(m, w.k, xq, w, group) || xs == nullptr || y == nullptr || ldy < w.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fp8GemvBf16: unsupported problem (m ", m, ", n ", w.n, ", k ", w.k,
                     ", group ", group, ", block ", w.block, "; needs 1 <= m <= ", kFp8GemvMaxRows,
                     ", k % 16 == 0, 16-byte aligned operands, block and group 128 or k)"));
  }
  const dim3 grid(static_cast<unsigned>((w.n + kGemvWarps - 1) / kGemvWarps));
  const int xs_cols = static_cast<int>((w.k + group - 1) / group);
  auto* out = reinterpret_cast<__nv_bfloat16*>(y);
  const int n = static_cast<int>(w.n), k = static_cast<int>(w.k);
  const int row_block = static_cast<int>(std::min<int64_t>(w.row_block, int64_t{1} << 30));
  const int block = static_cast<int>(w.block), ws_cols = static_cast<int>(w.scale_cols());
  const int g = static_cast<int>(group), ld = static_cast<int>(ldy);
  cudaStream_t s = AsCuda(stream);
#define TESSERA_FP8_GEMV(M)                                                                       \
  case M:                                                                                         \
    Fp8GemvKernel<M><<<grid, kGemvWarps * 32, 0, s>>>(xq, xs, g, xs_cols, w.data, n, k, w.scales, \
                                                      row_block, block, ws_cols, bias, out, ld);  \
    break;
  switch (m) {
    TESSERA_FP8_GEMV(1)
    TESSERA_FP8_GEMV(2)
    TESSERA_FP8_GEMV(3)
    TESSERA_FP8_GEMV(4)
    TESSERA_FP8_GEMV(5)
    TESSERA_FP8_GEMV(6)
    TESSERA_FP8_GEMV(7)
    TESSERA_FP8_GEMV(8)
  }
#undef TESSERA_FP8_GEMV
  return CheckLastLaunch("Fp8GemvBf16");
}

}  // namespace tessera::kernels::cuda
