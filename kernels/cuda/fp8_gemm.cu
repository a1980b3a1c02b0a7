#include <cublasLt.h>
#include <cuda_fp8.h>

#include <string>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_libraries.h"
#include "kernels/cuda/fp8_gemm.h"

namespace tessera::kernels::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;  // as kernels/cpu/fp8_linear.cc
constexpr int kThreads = 256;
constexpr size_t kLtWorkspaceBytes = 32u << 20;

__device__ __forceinline__ float E4m3ToFloat(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

__global__ void DequantizeKernel(const uint8_t* __restrict__ w, int64_t n, int64_t k,
                                 const float* __restrict__ scales, int64_t row_block, int64_t block,
                                 int64_t scale_cols, __nv_bfloat16* __restrict__ out) {
  const int64_t total = n * k;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = i / k, c = i % k;
    const float s = scales[(o / row_block) * scale_cols + c / block];
    out[i] = __float2bfloat16(E4m3ToFloat(w[i]) * s);
  }
}

// One CTA per (token, group), as the quantizer of fp8_gemv.cu, writing
// bf16(q * s) instead of q.
__global__ void QdqKernel(const __nv_bfloat16* __restrict__ x, int k, int group,
                          const float* __restrict__ static_scale, __nv_bfloat16* __restrict__ out) {
  const int t = blockIdx.y, g = blockIdx.x;
  const int start = g * group, end = min(k, start + group);
  const __nv_bfloat16* row = x + static_cast<int64_t>(t) * k;
  __shared__ float warp_max[kThreads / 32];
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
      for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
      scale_shared = __fdiv_rn(fmaxf(m, kAmaxFloor), kE4m3Max);
    }
    __syncthreads();
    scale = scale_shared;
  }
  for (int i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float q = fminf(fmaxf(__fdiv_rn(__bfloat162float(row[i]), scale), -kE4m3Max), kE4m3Max);
    const uint8_t code = static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
    out[static_cast<int64_t>(t) * k + i] = __float2bfloat16(E4m3ToFloat(code) * scale);
  }
}

__global__ void CopyPartKernel(const __nv_bfloat16* __restrict__ src, int64_t rows, int64_t cols,
                               __nv_bfloat16* __restrict__ dst, int64_t dst_ld) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[(i / cols) * dst_ld + i % cols] = src[i];
  }
}

absl::Status LtError(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string load = LastCudaLibraryError();
  return absl::InternalError(absl::StrCat(
      std::string(what), ": ",
      load.empty() ? absl::StrCat(cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")")
                   : load));
}

#define TESSERA_FP8_LT(expr)                                                      \
  do {                                                                            \
    const cublasStatus_t tessera_st_ = (expr);                                    \
    if (tessera_st_ != CUBLAS_STATUS_SUCCESS) return LtError(tessera_st_, #expr); \
  } while (0)

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::Status Fp8DequantizeWeightBf16(const Fp8DeviceWeight& w, Bf16* out, CudaStream stream) {
  if (w.data == nullptr || w.scales == nullptr || out == nullptr || w.n < 1 || w.k < 1 ||
      w.row_block < 1 || w.block < 1) {
    return absl::InvalidArgumentError("Fp8DequantizeWeightBf16: bad arguments");
  }
  const int64_t total = w.n * w.k;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  DequantizeKernel<<<blocks, kThreads, 0, AsCuda(stream)>>>(w.data, w.n, w.k, w.scales, w.row_block,
                                                            w.block, w.scale_cols(),
                                                            reinterpret_cast<__nv_bfloat16*>(out));
  return CheckLastLaunch("Fp8DequantizeWeightBf16");
}

absl::Status Fp8QuantizeDequantizeBf16(const Bf16* x, int64_t m, int64_t k,
                                       const Fp8ActivationQuant& quant, Bf16* out,
                                       CudaStream stream) {
  if (x == nullptr || out == nullptr || m < 1 || k < 1 || m > 65535 || k > (int64_t{1} << 30) ||
      !(quant.group == kFp8Block || quant.group == k)) {
    return absl::InvalidArgumentError(absl::StrCat("Fp8QuantizeDequantizeBf16: bad arguments (m ",
                                                   m, ", k ", k, ", group ", quant.group, ")"));
  }
  const int groups = static_cast<int>((k + quant.group - 1) / quant.group);
  QdqKernel<<<dim3(groups, static_cast<unsigned>(m)), kThreads, 0, AsCuda(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), static_cast<int>(k), static_cast<int>(quant.group),
      quant.static_scale, reinterpret_cast<__nv_bfloat16*>(out));
  return CheckLastLaunch("Fp8QuantizeDequantizeBf16");
}

absl::Status Fp8CopyPartOutput(const Bf16* src, int64_t rows, int64_t cols, Bf16* dst,
                               int64_t dst_ld, CudaStream stream) {
  if (src == nullptr || dst == nullptr || rows < 1 || cols < 1 || dst_ld < cols) {
    return absl::InvalidArgumentError(absl::StrCat("Fp8CopyPartOutput: bad arguments (rows ", rows,
                                                   ", cols ", cols, ", dst_ld ", dst_ld, ")"));
  }
  const int64_t total = rows * cols;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
  CopyPartKernel<<<blocks, kThreads, 0, AsCuda(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(src), rows, cols,
      reinterpret_cast<__nv_bfloat16*>(dst), dst_ld);
  return CheckLastLaunch("Fp8CopyPartOutput");
}

struct Fp8BlockGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  ~Impl() {
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> Fp8BlockGemm::Create() {
  std::unique_ptr<Fp8BlockGemm> g(new Fp8BlockGemm());
  g->impl_ = std::make_unique<Impl>();
  TESSERA_FP8_LT(cublasLtCreate(&g->impl_->handle));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->impl_->workspace, kLtWorkspaceBytes));
  return g;
}

Fp8BlockGemm::~Fp8BlockGemm() = default;

absl::Status Fp8BlockGemm::Run(const uint8_t* xq, const float* xs, int64_t m, const uint8_t* w,
                               const float* ws, int64_t n, int64_t k, Bf16* y, CudaStream stream) {
  if (xq == nullptr || xs == nullptr || w == nullptr || ws == nullptr || y == nullptr || m < 16 ||
      n < 16 || k < 16 || m % 16 != 0 || n % 16 != 0 || k % 16 != 0 || m > (int64_t{1} << 30) ||
      n > (int64_t{1} << 30) || k > (int64_t{1} << 30) || !Aligned16(xq) || !Aligned16(w) ||
      !Aligned16(y)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8BlockGemm: m ", m, ", n ", n, ", k ", k,
        " must be multiples of 16 with 16-byte aligned operands (cuBLASLt's FP8 path)"));
  }
  // D[n, m] (column-major) = op(A)[n, k] . B[k, m]: A is the weight (k x n
  // column-major = [n, k] row-major, transposed), B the activations.
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  };
  auto run = [&]() -> absl::Status {
    TESSERA_FP8_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    TESSERA_FP8_LT(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    TESSERA_FP8_LT(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    TESSERA_FP8_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                  sizeof(a_mode)));
    TESSERA_FP8_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                  sizeof(b_mode)));
    TESSERA_FP8_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws,
                                                  sizeof(ws)));
    TESSERA_FP8_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs,
                                                  sizeof(xs)));
    TESSERA_FP8_LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, n, k));
    TESSERA_FP8_LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, m, k));
    TESSERA_FP8_LT(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, n, m, n));
    TESSERA_FP8_LT(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kLtWorkspaceBytes;
    TESSERA_FP8_LT(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    TESSERA_FP8_LT(
        cublasLtMatmulAlgoGetHeuristic(impl_->handle, desc, a, b, d, d, pref, 1, &result, &found));
    if (found == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuBLASLt offers no block-scaled FP8 algorithm for m=", m, " n=", n, " k=", k));
    }
    const float alpha = 1.f, beta = 0.f;
    TESSERA_FP8_LT(cublasLtMatmul(impl_->handle, desc, &alpha, w, a, xq, b, &beta, y, d, y, d,
                                  &result.algo, impl_->workspace, kLtWorkspaceBytes,
                                  AsCuda(stream)));
    return absl::OkStatus();
  };
  absl::Status s = run();
  cleanup();
  return s;
}

}  // namespace tessera::kernels::cuda
