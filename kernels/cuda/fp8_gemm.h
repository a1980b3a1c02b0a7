// FP8 linears on the GPU for prefill (many tokens), the two paths of
// kernels/cuda_fp8_backend.h:
//
//   dequantize (every SM 8.0+ GPU; the only one on 8.0 / 8.6, which have no
//   FP8 tensor cores): Fp8DequantizeWeightBf16 writes bf16(e4m3 * scale) of
//   the weight, Fp8QuantizeDequantizeBf16 rounds the activations through
//   e4m3 exactly as Fp8QuantizeActivations does (then back to bf16), and the
//   bf16 cuBLASLt GEMM (gemm.h) multiplies them. Against the fp32 reference
//   (kernels/cpu/fp8_linear.h) this adds one bf16 rounding of each operand.
//
//   cuBLASLt block-scaled FP8 (Hopper, CUDA >= 12.9): Fp8BlockGemm runs
//   cuBLASLt's FP8 GEMM with the activations' per-token-group-128 scales
//   (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) and the weights' 128x128 block
//   scales (BLK128x128_32F); cuBLASLt applies each to the 128-deep partial
//   sums of its wgmma tiles, the fine-grained reference's arithmetic. A
//   well-kept vendor library with per-shape heuristics beats a hand-written
//   kernel here, and it needs no arch-specific image of ours.
//   Scale layouts given to cuBLASLt, both row-major as written elsewhere
//   (found on an H200 by cuda_fp8_gemm_test against the CPU reference; the
//   transposed layouts give errors of 30-90% of the result):
//     activations  xs[t * ceil(k/128) + g] for token t, K-group g, as
//                  Fp8QuantizeActivations writes them;
//     weights      the checkpoint's grid ws[nb * ceil(k/128) + kb], as is.
//   Hopper's FP8 tensor cores accumulate each 128-deep block at reduced
//   precision: results differ from the fp32 reference by up to ~2e-4 of
//   sum |x * w| (measured), besides the bf16 output rounding.
//   REQUIRES: m, n, k multiples of 16; 16-byte aligned operands.
//
// Thread-safety: an Fp8BlockGemm is used by one stream at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/fp8_gemv.h"

namespace tessera::kernels::cuda {

// out [n, k] bf16 = bf16(e4m3(w) * scale) (one rounding).
absl::Status Fp8DequantizeWeightBf16(const Fp8DeviceWeight& w, Bf16* out, CudaStream stream);

// out [m, k] bf16 = bf16(e4m3(clamp(x / s)) * s) with s as Fp8QuantizeActivations.
absl::Status Fp8QuantizeDequantizeBf16(const Bf16* x, int64_t m, int64_t k,
                                       const Fp8ActivationQuant& quant, Bf16* out,
                                       CudaStream stream);

// dst[t * dst_ld + c] = src[t * cols + c] for t < rows, c < cols: one FP8
// part's output into its columns of a fused linear's (worker/runner/cuda/
// cuda_linear.h). Graph-capturable.
absl::Status Fp8CopyPartOutput(const Bf16* src, int64_t rows, int64_t cols, Bf16* dst,
                               int64_t dst_ld, CudaStream stream);

class Fp8BlockGemm {
 public:
  static absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> Create();
  ~Fp8BlockGemm();
  Fp8BlockGemm(const Fp8BlockGemm&) = delete;
  Fp8BlockGemm& operator=(const Fp8BlockGemm&) = delete;

  // y[m, n] bf16 = sum over K of (xq xs)(Wq ws) per 128-block; xs and
  // ws in the layouts above. INVALID_ARGUMENT for shapes cuBLASLt's
  // FP8 path does not take; INTERNAL with cuBLASLt's status otherwise.
  absl::Status Run(const uint8_t* xq, const float* xs, int64_t m, const uint8_t* w, const float* ws,
                   int64_t n, int64_t k, Bf16* y, CudaStream stream);

 private:
  Fp8BlockGemm() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::kernels::cuda
