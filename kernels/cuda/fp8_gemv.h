// FP8 linears on the GPU for decode (few tokens): activation quantization
// to e4m3 and a GEMV that reads e4m3 weights directly, with the arithmetic
// of kernels/cpu/fp8_linear.h (the CPU reference these kernels are tested
// against):
//
//   Fp8QuantizeActivations: x bf16 [m, k] -> xq e4m3 [m, k] and fp32 scales
//     xs [m, ceil(k / group)] (row-major), per token and group of `group`
//     features (group = k: per token): xs = max(amax, 1e-10) / 448,
//     xq = e4m3(clamp(x / xs, +-448)) with IEEE division and round to nearest
//     even, bit-identical to the CPU's QuantizeActivations. A static scale
//     (one fp32 on the device) replaces the amax; kNone is not a mode here
//     (weight-only FP8 takes the dequantize path).
//   Fp8GemvBf16: y[t, o] = sum over K-chunks c of
//       (sum_{i in c} xq[t, i] * Wq[o, i]) * xs[t, c] * ws[o / row_block, c]
//     (+ bias[o]), one fp32 partial sum per 128-feature chunk, each scale
//     applied once to it; y bf16 with row stride ldy.
//
// Weight scales: ws is a row-major [ceil(n / row_block), ceil(k / 128)]
// grid when block = 128 (fine-grained and compressed-tensors block:
// row_block 128; row_block 1 for row-expanded grids), or [ceil(n /
// row_block), 1] with block = k (channel: row_block 1; tensor: row_block n).
//
// The GEMV is bandwidth-bound: one warp per output row streams the row with
// 16-byte loads (8 lanes per 128-feature chunk, 4 chunks per warp step),
// sums each chunk across its 8 lanes with shuffles, scales it once and
// accumulates; x is read through the read-only cache (m * k bytes, shared
// by every warp).
//
// Requirements (Fp8GemvApplicable): 1 <= m <= kFp8GemvMaxRows, k % 16 == 0,
// 16-byte aligned xq and W, block and group in {128, k}. All pointers are
// device pointers; nothing allocates or synchronizes (graph-capturable).
//
// Thread-safety: stateless; concurrent calls on different outputs are fine.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

inline constexpr int64_t kFp8GemvMaxRows = 8;
inline constexpr int64_t kFp8Block = 128;

struct Fp8DeviceWeight {
  const uint8_t* data = nullptr;  // e4m3 [n, k]
  int64_t n = 0, k = 0;
  const float* scales = nullptr;  // see above
  int64_t row_block = kFp8Block;  // rows one scale row covers
  int64_t block = kFp8Block;      // features one scale covers (128 or k)

  int64_t scale_cols() const { return (k + block - 1) / block; }
};

// Per-token groups of `group` features (128, or k for per-token scales);
// static_scale (device, one fp32) set: static quantization instead.
struct Fp8ActivationQuant {
  int64_t group = kFp8Block;
  const float* static_scale = nullptr;
};

// INVALID_ARGUMENT for bad shapes or a group other than 128 / k.
absl::Status Fp8QuantizeActivations(const Bf16* x, int64_t m, int64_t k,
                                    const Fp8ActivationQuant& quant, uint8_t* xq, float* xs,
                                    CudaStream stream);

bool Fp8GemvApplicable(int64_t m, int64_t k, const uint8_t* xq, const Fp8DeviceWeight& w,
                       int64_t group);

// y[t * ldy + o] for t < m, o < w.n. INVALID_ARGUMENT when !Fp8GemvApplicable.
absl::Status Fp8GemvBf16(const uint8_t* xq, const float* xs, int64_t m, int64_t group,
                         const Fp8DeviceWeight& w, const float* bias, Bf16* y, int64_t ldy,
                         CudaStream stream);

}  // namespace tessera::kernels::cuda
