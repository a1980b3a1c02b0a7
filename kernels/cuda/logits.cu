// Softmax, LogSoftmax and Argmax over logits rows (see logits.h). One block
// of 1024 threads per row; the max is exact, the normaliser is a double sum
// of expf terms (as the reference sums exp in double).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/logits.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

template <bool LOG>
__global__ void __launch_bounds__(kThreads)
    SoftmaxKernel(const float* __restrict__ logits, int64_t vocab, float* __restrict__ out) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float* y = out + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = -__int_as_float(0x7f800000);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, x[i]);
  m = BlockMax(m, fscratch, -__int_as_float(0x7f800000));
  double sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    sum += static_cast<double>(expf(x[i] - m));
  }
  sum = BlockSum(sum, dscratch);
  if constexpr (LOG) {
    const double log_z = static_cast<double>(m) + log(sum);
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      y[i] = static_cast<float>(static_cast<double>(x[i]) - log_z);
    }
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) y[i] = expf(x[i] - m) * inv;
  }
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ out) {
  __shared__ ValueIndex scratch[32];
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  ValueIndex best{-__int_as_float(0x7f800000), INT64_MAX};
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const ValueIndex c{x[i], i};
    if (Better(c, best)) best = c;
  }
  best = BlockArgmax(best, scratch);
  if (threadIdx.x == 0) {
    // All -inf (or NaN) rows: index 0, as the reference.
    out[blockIdx.x] = best.index < vocab ? static_cast<int32_t>(best.index) : 0;
  }
}

absl::Status CheckLogitsArgs(const void* in, int64_t rows, int64_t vocab, const void* out,
                             std::string_view op) {
  if (rows < 0 || vocab <= 0 || rows > 2147483647) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(op), ": bad shape rows=", rows, " vocab=", vocab));
  }
  if (rows > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(op), ": null pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Softmax(const float* logits, int64_t rows, int64_t vocab, float* out,
                     CudaStream stream) {
  if (absl::Status s = CheckLogitsArgs(logits, rows, vocab, out, "Softmax"); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  SoftmaxKernel<false>
      <<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, out);
  return CheckLastLaunch("Softmax");
}

absl::Status LogSoftmax(const float* logits, int64_t rows, int64_t vocab, float* out,
                        CudaStream stream) {
  if (absl::Status s = CheckLogitsArgs(logits, rows, vocab, out, "LogSoftmax"); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  SoftmaxKernel<true>
      <<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, out);
  return CheckLastLaunch("LogSoftmax");
}

absl::Status ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                        CudaStream stream) {
  if (absl::Status s = CheckLogitsArgs(logits, rows, vocab, out, "ArgmaxRows"); !s.ok()) return s;
  if (vocab > 2147483647) return absl::InvalidArgumentError("ArgmaxRows: vocab above int32");
  if (rows == 0) return absl::OkStatus();
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, out);
  return CheckLastLaunch("ArgmaxRows");
}

}  // namespace tessera::kernels::cuda
