// Writes new K/V rows into the paged bf16 KV cache on the GPU.
//
// k: [tokens, num_kv_heads, head_dim] with token stride k_token_stride
// (elements), v likewise; slot_mapping: int64 [tokens] (device). Cache K and
// V each [num_blocks, block_size, num_kv_heads, head_dim], slot =
// block * block_size + offset, num_slots = num_blocks * block_size. A
// negative slot is skipped (padding); a slot >= num_slots is also skipped
// (never written; the caller validates slots on the host and treats that as
// an error there).
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write the
// same slots.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status WriteKvCache(const Bf16* k, int64_t k_token_stride, const Bf16* v,
                          int64_t v_token_stride, int64_t tokens, int num_kv_heads, int head_dim,
                          const int64_t* slot_mapping, Bf16* k_cache, Bf16* v_cache,
                          int64_t num_slots, CudaStream stream);

}  // namespace tessera::kernels::cuda
