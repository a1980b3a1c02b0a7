// RandomCudaWeights: a CudaWeightsFactory of random bf16 weights made on
// the device, for benchmarks (speed does not depend on weight values):
// uniform values of scale 0.03, norms 1, no biases, in the layouts the
// runner would upload (worker/runner/cuda/cuda_weights.h). Sparse layers of
// an MoE config get a random router (so tokens spread over the experts as
// with a trained one, roughly uniformly), correction biases of 1 (equal:
// they do not steer the choice), every held expert and the shared experts.
//
// Thread-safety: the factory may be called from any rank's thread.
#pragma once

#include <cstdint>

#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::bench {

// Each rank's values derive from `seed` and its rank.
runner::CudaWeightsFactory RandomCudaWeights(uint64_t seed);

}  // namespace tessera::bench
