// Fills a staged step's placeholder token ids on the GPU with the ids the
// step before it drew, so that a runner can queue step N+1 before step N's
// tokens reach the host (runner::PreviousStepToken, ModelRunner::SubmitSample).
//
// pairs: n (token_index, row) int32 pairs, device memory:
//   tokens[token_index] = drawn[row]
// A drawn id outside [0, vocab) (-1: the sampler could not draw the row)
// becomes token 0, so the step reads a valid embedding row; the engine
// fails that row's request when it collects the step, and drops what the
// next step computed for it. The caller checks the pairs on the host
// (token_index < the step's tokens, row < the previous step's rows).
//
// Thread-safety: enqueues on `stream`, after the staging copy and the
// previous step's draws, before the step that reads `tokens`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// INVALID_ARGUMENT for n < 0, vocab < 1, or null pointers when n > 0.
absl::Status PatchTokensFromPrevious(int32_t* tokens, const int32_t* drawn, const int32_t* pairs,
                                     int64_t n, int64_t vocab, CudaStream stream);

}  // namespace tessera::kernels::cuda
