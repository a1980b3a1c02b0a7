// Row-wise logits processing on the GPU, fp32 [rows, vocab] (device):
//   Softmax / LogSoftmax   -inf entries allowed (probability 0 / -inf); a row
//                          of only -inf gives NaN, as the reference does
//   ArgmaxRows             index of the largest value, lowest index among
//                          ties (torch.argmax); always in [0, vocab). Rows
//                          must not hold NaN (the index is then unspecified)
// One block per row; max and sum accumulate in fp32 / double as noted in
// logits.cu.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

absl::Status Softmax(const float* logits, int64_t rows, int64_t vocab, float* out,
                     CudaStream stream);

absl::Status LogSoftmax(const float* logits, int64_t rows, int64_t vocab, float* out,
                        CudaStream stream);

absl::Status ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                        CudaStream stream);

}  // namespace tessera::kernels::cuda
