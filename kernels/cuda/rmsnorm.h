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
// Both launch as programmatic dependents of the kernel before them on the
// stream (dependent_launch.cuh, SM 9.0+), so their launch overlaps its end.
// FusedAddRmsNorm on the vector path with cols <= 16384 reads `residual`
// and `w` before that kernel ends: they must not be its outputs
// (delta may be, as after a projection; the decode steps' residual was
// written kernels earlier).
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
