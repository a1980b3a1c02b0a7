// Gathers rows of a bf16 matrix on the GPU (the LM head then runs only on
// the rows that need logits): out[i, :] = x[rows[i], :].
//
// x: bf16 [x_rows, cols]; rows: int32 [n] (device); out: bf16 [n, cols].
// `x_rows` was added to the planned signature so that the kernel can bound
// the indices: a row index outside [0, x_rows) writes a zero row instead of
// reading out of bounds.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status GatherRows(const Bf16* x, int64_t x_rows, int64_t cols, const int32_t* rows, int64_t n,
                        Bf16* out, CudaStream stream);

}  // namespace tessera::kernels::cuda
