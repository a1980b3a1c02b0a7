// SiLU-and-multiply on the GPU: gate_up bf16 [rows, 2*inter] (gate first,
// then up) -> out bf16 [rows, inter] = silu(gate) * up, fp32 math. With
// `interleaved`, each row's columns are in the GEMV's gate/up order (gemv.h
// GemvGateUpRow: gate j .. j + 3 then up j .. j + 3 in every 8 columns);
// needs inter % 4 == 0, gate_up 16-byte and out 8-byte aligned.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status SiluMul(const Bf16* gate_up, int64_t rows, int64_t inter, Bf16* out, CudaStream stream,
                     bool interleaved = false);

}  // namespace tessera::kernels::cuda
