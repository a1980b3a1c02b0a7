// FP8 linear layers on the CPU (Op::kFp8Gemm): y = x . W^T (+ b) for an
// e4m3 weight with fp32 scales, and activations quantized to e4m3 on the fly
// as the checkpoint's format prescribes. The arithmetic every FP8 kernel of
// Tessera follows (the CUDA GEMV and GEMMs are tested against this):
//
//   weights: W[o, i] = e4m3(Wq[o, i]) * ws[o, i / scale_block]   (exact decode)
//   activations, per token t (mode):
//     kNone          xq = x, xs = 1                          (weight-only FP8)
//     kDynamicGroup  per group g of `group` features:
//                    xs[t, g] = max(amax |x[t, g]|, 1e-10) / 448
//     kDynamicToken  the same over the whole row (one group)
//     kStatic        xs = static_scale (the checkpoint's input_scale)
//                    and xq[t, i] = e4m3(clamp(x[t, i] / xs, -448, 448))
//   product: the K axis is cut into chunks of c = min(scale_block, group)
//     features (group = cols unless kDynamicGroup); per chunk an fp32
//     partial sum p = sum_i xq[t, i] * Wq[o, i] is formed and
//       y[t, o] = sum_chunks p * xs[t, chunk's group] * ws[o, chunk's block] (+ b[o])
//   i.e. each scale is applied once per partial sum, as the block-scaled
//   tensor-core GEMMs (DeepSeek-V3's w8a8_block_fp8_matmul, cuBLASLt's
//   VEC128 x BLK128x128 mode) do. The amax clamp keeps an all-zero group
//   at zero (the fine-grained reference would divide 0 by 0 there).
//
// Layouts: x [m, cols] fp32 row-major; y row t at y + t * ldy; weights
// [rows, cols] e4m3 row-major; scales [rows, scale_cols()] fp32, one row per
// weight row (block scales of 128-row blocks are expanded to every row at
// load, so rows of several matrices may be stacked: fused q/k/v and
// gate/up). REQUIRES: scale_block and group each either a multiple of the
// other or >= cols; y does not overlap x.
//
// Thread-safety: reentrant; the optimized entry splits over the context's pool.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera::kernels::cpu {

enum class Fp8ActivationMode { kNone, kDynamicGroup, kDynamicToken, kStatic };

struct Fp8Activation {
  Fp8ActivationMode mode = Fp8ActivationMode::kDynamicGroup;
  int64_t group = 128;       // kDynamicGroup
  float static_scale = 1.f;  // kStatic
};

struct Fp8WeightMatrix {
  const uint8_t* data = nullptr;  // e4m3 [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  const float* scales = nullptr;  // [rows, scale_cols()]
  int64_t scale_block = 128;      // features one scale covers along K

  int64_t scale_cols() const { return (cols + scale_block - 1) / scale_block; }
};

// Features per activation group (cols unless kDynamicGroup).
int64_t ActivationGroup(const Fp8Activation& a, int64_t cols);

// The quantized activations of x [m, cols], decoded back to fp32 (exact
// e4m3 values) in xq [m, cols], and their scales in xs [m, ceil(cols /
// ActivationGroup)]. kNone copies x and writes scales of 1.
void QuantizeActivations(const float* x, int64_t m, int64_t cols, const Fp8Activation& a, float* xq,
                         float* xs);

// OK when the shapes and blocks fit the REQUIRES above; else INVALID_ARGUMENT.
absl::Status ValidateFp8Gemm(const Fp8WeightMatrix& w, const Fp8Activation& a);

// y[t, o] for t < m, o < w.rows (see the header comment). Threaded.
void Fp8Gemm(const CpuContext& ctx, const float* x, int64_t m, const Fp8WeightMatrix& w,
             const Fp8Activation& a, const float* bias, float* y, int64_t ldy);

namespace reference {
// The same in plain loops on one thread.
void Fp8Gemm(const float* x, int64_t m, const Fp8WeightMatrix& w, const Fp8Activation& a,
             const float* bias, float* y, int64_t ldy);
}  // namespace reference

}  // namespace tessera::kernels::cpu
