#include "kernels/cuda/random_fill.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

// splitmix64: a full-period mix of a 64-bit counter.
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillRandomBf16Kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, float scale) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t r = Mix(seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void FillConstantF32Kernel(float* out, int64_t n, float value) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = value;
  }
}

int GridFor(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 65536 ? (blocks < 1 ? 1 : blocks) : 65536);
}

}  // namespace

absl::Status FillRandomBf16(Bf16* out, int64_t n, uint64_t seed, float scale, CudaStream stream) {
  if (n < 0 || (n > 0 && out == nullptr)) {
    return absl::InvalidArgumentError("FillRandomBf16: bad size or null pointer");
  }
  if (n == 0) return absl::OkStatus();
  FillRandomBf16Kernel<<<GridFor(n), 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(out), n,
                                                       seed, scale);
  return CudaError(cudaGetLastError(), "FillRandomBf16");
}

absl::Status FillConstantF32(float* out, int64_t n, float value, CudaStream stream) {
  if (n < 0 || (n > 0 && out == nullptr)) {
    return absl::InvalidArgumentError("FillConstantF32: bad size or null pointer");
  }
  if (n == 0) return absl::OkStatus();
  FillConstantF32Kernel<<<GridFor(n), 256, 0, stream>>>(out, n, value);
  return CudaError(cudaGetLastError(), "FillConstantF32");
}

}  // namespace tessera::kernels::cuda
