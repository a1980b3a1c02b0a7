// Copies whole slots of the paged bf16 KV cache on the GPU: after a token
// tree is verified, the accepted nodes' K/V move to the consecutive slots
// after the committed tokens (ModelRunner::CopyKvSlots).
//
// k_cache and v_cache each hold `num_layers` layers of `layer_elems`
// elements; a slot is `row_elems` (num_kv_heads * head_dim) consecutive
// elements of a layer, slot s at s * row_elems. For every layer, of K and
// of V, pair i copies slot from[i] to slot to[i], in order i = 0, 1, ...:
// a pair reads what earlier pairs wrote (as sequential memcpys do), so
// overlapping source and destination sets behave like the CPU runner's
// loop. from and to are device arrays of `pairs` int64 slots; the caller
// checks them on the host (inside [0, num_slots)).
//
// Thread-safety: enqueues on `stream`; no other work may touch the copied
// slots until it completes.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status CopyKvCacheSlots(Bf16* k_cache, Bf16* v_cache, int64_t num_layers, int64_t layer_elems,
                              int64_t row_elems, const int64_t* from, const int64_t* to,
                              int64_t pairs, CudaStream stream);

}  // namespace tessera::kernels::cuda
