#include "worker/runner/cuda/cuda_linear.h"

#include "kernels/cuda/gemm.h"

namespace tessera::runner {

absl::Status CudaLinear::Apply(kernels::cuda::GemmContext& gemm, const kernels::cuda::Bf16* x,
                               int64_t rows, kernels::cuda::Bf16* y,
                               kernels::cuda::CudaStream stream, Input input) const {
  if (input == Input::kJustWritten) return gemm.GemmChained(x, rows, in, w(), out, b(), y, stream);
  return gemm.Gemm(x, rows, in, w(), out, b(), y, stream);
}

}  // namespace tessera::runner
