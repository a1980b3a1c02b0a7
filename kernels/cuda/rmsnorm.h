// RMSNorm on the GPU, fp32 math, bf16 output (the next sublayer's input).
//
//   RmsNorm:          out = x / sqrt(mean(x^2) + eps) * w
//   FusedAddRmsNorm:  residual += float(delta); out = RmsNorm(residual) * w
//                     (vLLM's fused_add_rms_norm: `residual` is the fp32
//                     residual stream, `delta` a sublayer's bf16 output)
// x, residual: fp32 [rows, cols]; delta, out: bf16 [rows, cols]; w: fp32
// [cols]. All device pointers; `out` may alias `delta` (in place). One
// block per row; 16-byte vector loads when cols % 4 == 0 and the pointers
// allow, else scalar.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status RmsNorm(const float* x, int64_t rows, int64_t cols, const float* w, float eps,
                     Bf16* out, CudaStream stream);

absl::Status FusedAddRmsNorm(const Bf16* delta, float* residual, int64_t rows, int64_t cols,
                             const float* w, float eps, Bf16* out, CudaStream stream);

}  // namespace tessera::kernels::cuda
