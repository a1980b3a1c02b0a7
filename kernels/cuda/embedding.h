// Token embedding lookup on the GPU: out[i, :] = float(table[ids[i], :]).
//
// table: bf16 [vocab, hidden] (device); ids: int32 [n] (device); out: fp32
// [n, hidden] (device, the residual stream). An id outside [0, vocab) never
// reads out of bounds: its row is written as zeros (the caller is expected
// to have validated ids on the host; zeros make a stray id visible but safe).
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// INVALID_ARGUMENT for negative sizes or null pointers with n > 0; INTERNAL
// when the launch fails.
absl::Status Embedding(const Bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                       int64_t n, float* out, CudaStream stream);

// The same lookup into bf16 (the table's values, bit for bit; zeros for an
// id outside [0, vocab)), for a vocabulary-parallel embedding that a bf16
// all-reduce sums: exactly one rank holds each id, so the sum is exact.
absl::Status EmbeddingBf16(const Bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                           int64_t n, Bf16* out, CudaStream stream);

}  // namespace tessera::kernels::cuda
