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

// One block per row. Rows whose start is 16-byte aligned are read as float4
// with 8 independent loads in flight per thread (one block otherwise waits on
// one load at a time and takes ~40 us for a 128k vocabulary); every thread
// visits its values in ascending index and keeps the first of equal values,
// and BlockArgmax breaks ties between threads by index.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ out) {
  __shared__ ValueIndex scratch[32];
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  ValueIndex best{-__int_as_float(0x7f800000), INT64_MAX};
  auto consider = [&](float v, int64_t i) {
    if (v > best.value || (v == best.value && i < best.index)) best = ValueIndex{v, i};
  };
  int64_t scalar_from = 0;
  if constexpr (VEC) {
    constexpr int kLoads = 8;
    const int64_t chunks = vocab / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t base = 0; base < chunks; base += int64_t{kThreads} * kLoads) {
      float4 v[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t c = base + int64_t{j} * kThreads + threadIdx.x;
        v[j] = c < chunks ? __ldg(x4 + c)
                          : make_float4(-__int_as_float(0x7f800000), -__int_as_float(0x7f800000),
                                        -__int_as_float(0x7f800000), -__int_as_float(0x7f800000));
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t c = base + int64_t{j} * kThreads + threadIdx.x;
        if (c >= chunks) continue;
        consider(v[j].x, 4 * c);
        consider(v[j].y, 4 * c + 1);
        consider(v[j].z, 4 * c + 2);
        consider(v[j].w, 4 * c + 3);
      }
    }
    scalar_from = chunks * 4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < vocab; i += blockDim.x) consider(x[i], i);
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
  // Every row starts 16-byte aligned when the first does and vocab % 4 == 0.
  if (Aligned(logits, 16) && vocab % 4 == 0) {
    ArgmaxKernel<true>
        <<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, out);
  } else {
    ArgmaxKernel<false>
        <<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, out);
  }
  return CheckLastLaunch("ArgmaxRows");
}

}  // namespace tessera::kernels::cuda
