// CudaLinear: one linear layer y = x · Wᵀ (+ b) on the GPU, bf16 weights
// [out, in] with fp32 accumulation and an fp32 bias. The seam where other
// weight formats (FP8 with scales) plug in: a layer module calls Apply and
// does not know how the product is computed.
//
// Thread-safety: const; the GemmContext and the stream are the caller's.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::kernels::cuda {
class GemmContext;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

struct CudaLinear {
  kernels::cuda::DeviceBuffer weight;  // bf16 [out, in]
  kernels::cuda::DeviceBuffer bias;    // fp32 [out]; empty = none
  int64_t out = 0, in = 0;

  const kernels::cuda::Bf16* w() const { return weight.as<kernels::cuda::Bf16>(); }
  const float* b() const { return bias.size() == 0 ? nullptr : bias.as<float>(); }

  // Where x comes from: written by the kernel just before on the stream
  // (the staged GEMV may then overlap its weight reads with that kernel,
  // kernels/cuda/gemm.h GemmChained), or anything else.
  enum class Input { kJustWritten, kAny };
  // y[rows, out] = x[rows, in] · Wᵀ (+ b).
  absl::Status Apply(kernels::cuda::GemmContext& gemm, const kernels::cuda::Bf16* x,
                     int64_t rows, kernels::cuda::Bf16* y, kernels::cuda::CudaStream stream,
                     Input input = Input::kAny) const;
};

}  // namespace tessera::runner
