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
// With `kv` (optional), the same kernel also stores each token's K (after
// RoPE, the bf16 values written to k) and V into the paged KV cache, exactly
// as WriteKvCache (kv_cache_write.h) would: slot = kv->slots[t], rows of
// num_kv_heads * head_dim elements, tokens with a slot outside
// [0, num_slots) skipped. Saves one launch per layer and step.
//
// With `rope_order` the q and k heads come in the row order of the fused
// GEMV (gemv.h GemvRopeRow: feature f of a head at GemvRopeRow(f,
// head_dim)), as a projection with RoPE-ordered weights leaves them; the
// rotated heads are written back in the normal order. Needs head_dim % 16
// == 0 and no q/k norms.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

struct RopeKvWrite {
  const Bf16* v = nullptr;  // [tokens, num_kv_heads, head_dim], token stride v_token_stride
  int64_t v_token_stride = 0;
  const int64_t* slots = nullptr;  // [tokens]
  Bf16* k_cache = nullptr;         // [num_slots, num_kv_heads * head_dim]
  Bf16* v_cache = nullptr;
  int64_t num_slots = 0;
};

absl::Status Rope(Bf16* q, int64_t q_token_stride, int num_heads, Bf16* k, int64_t k_token_stride,
                  int num_kv_heads, int head_dim, const int32_t* positions, int64_t tokens,
                  const float* inv_freq, const float* q_norm, const float* k_norm, float norm_eps,
                  CudaStream stream, const RopeKvWrite* kv = nullptr, bool rope_order = false);

}  // namespace tessera::kernels::cuda
