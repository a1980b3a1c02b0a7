// Device-side fills for benchmark models and tests: deterministic
// pseudo-random bf16 values (a counter hash of (seed, index), uniform in
// [-scale, scale]) and constants, so multi-GB weights need no host copy.
//
// Thread-safety: enqueues on `stream`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status FillRandomBf16(Bf16* out, int64_t n, uint64_t seed, float scale, CudaStream stream);
absl::Status FillConstantF32(float* out, int64_t n, float value, CudaStream stream);

}  // namespace tessera::kernels::cuda
