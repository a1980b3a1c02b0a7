// SiLU-and-multiply on the GPU: gate_up bf16 [rows, 2*inter] (gate first,
// then up) -> out bf16 [rows, inter] = silu(gate) * up, fp32 math.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status SiluMul(const Bf16* gate_up, int64_t rows, int64_t inter, Bf16* out,
                     CudaStream stream);

}  // namespace tessera::kernels::cuda
