// Rotary position embedding on the GPU, in place on bf16 q and k, with the
// optional per-head RMSNorm of Qwen3 (q_norm / k_norm) fused before it.
//
// q: [tokens, num_heads, head_dim] with token stride q_token_stride
// (elements); k likewise with k_token_stride; both may sit inside one fused
// qkv row. Pair (i, i + head_dim/2) of each head rotates by
// angle = float(positions[t]) * inv_freq[i] (neox / rotate_half):
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin.
// inv_freq: fp32 [head_dim/2] with any scaling folded in. When q_norm
// (k_norm) is non-null, each q (k) head is first RMS-normalised over its
// head_dim values with weights q_norm[head_dim] and `norm_eps`. All math in
// fp32, one rounding to bf16 at the end. head_dim even, 2..512. q or k may
// be null (that part is skipped).
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status Rope(Bf16* q, int64_t q_token_stride, int num_heads, Bf16* k, int64_t k_token_stride,
                  int num_kv_heads, int head_dim, const int32_t* positions, int64_t tokens,
                  const float* inv_freq, const float* q_norm, const float* k_norm, float norm_eps,
                  CudaStream stream);

}  // namespace tessera::kernels::cuda
