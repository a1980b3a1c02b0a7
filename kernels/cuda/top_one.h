// Per-row maximum of logits and its index (ties -> the lowest index, as
// torch.argmax), on the GPU: greedy decoding without copying logits to the
// host, and the pieces a vocabulary-parallel LM head combines across ranks
// (the largest value wins; ties go to the lower index, i.e. the lower rank).
//
// Thread-safety: enqueues on `stream`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// logits fp32 [rows, vocab]; ids[r] = argmax + index_offset; values[r] = max.
// NaN entries are skipped; a row of only NaN gives id -1.
absl::Status TopOneRows(const float* logits, int64_t rows, int64_t vocab, int64_t index_offset,
                        int32_t* ids, float* values, CudaStream stream);

}  // namespace tessera::kernels::cuda
