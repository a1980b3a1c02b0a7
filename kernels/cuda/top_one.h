// Per-row maximum of logits and its index (ties -> the lowest index, as
// torch.argmax), on the GPU: greedy decoding without copying logits to the
// host, and the pieces a vocabulary-parallel LM head combines across ranks
// (the largest value wins; ties go to the lower index, i.e. the lower rank).
//
// Each row is split over several CTAs (about two waves of them in all), each
// leaving its best (value, index) in the workspace; a second kernel picks the
// best of each row's pieces. -0.0 and +0.0 count as equal.
//
// Thread-safety: enqueues on `stream`; one workspace serves one stream at a
// time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// Workspace bytes TopOneRows needs for up to `max_rows` rows (any vocab).
size_t TopOneWorkspaceBytes(int64_t max_rows);

// logits fp32 [rows, vocab]; ids[r] = argmax + index_offset; values[r] = max.
// NaN entries are skipped; a row of only NaN gives id -1. `workspace` holds
// TopOneWorkspaceBytes(rows) bytes (no initial contents needed).
absl::Status TopOneRows(const float* logits, int64_t rows, int64_t vocab, int64_t index_offset,
                        int32_t* ids, float* values, void* workspace, size_t workspace_bytes,
                        CudaStream stream);

}  // namespace tessera::kernels::cuda
