// SMs held busy for tests (see occupy.h).
#include "kernels/cuda/occupy.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

__global__ void OccupyKernel(uint64_t ns) {
  extern __shared__ unsigned char held[];
  if (threadIdx.x != 0) return;
  held[0] = 1;
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < ns) {
  }
}

// Needs local memory: an array indexed by values the compiler cannot see.
__global__ void LocalMemoryKernel(int* out, int seed) {
  int scratch[256];
  for (int i = 0; i < 256; ++i) scratch[i] = seed * i + static_cast<int>(threadIdx.x);
  out[threadIdx.x] = scratch[(seed + static_cast<int>(threadIdx.x)) & 255];
}

}  // namespace

absl::Status RunLocalMemoryKernel(int* out, int seed, CudaStream stream) {
  if (out == nullptr) return absl::InvalidArgumentError("RunLocalMemoryKernel: null output");
  LocalMemoryKernel<<<1, 32, 0, AsCuda(stream)>>>(out, seed);
  return CheckLastLaunch("RunLocalMemoryKernel");
}

absl::Status OccupySms(int ctas, double seconds, CudaStream stream) {
  if (ctas < 1 || !(seconds > 0.0 && seconds <= 60.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("OccupySms: ctas=", ctas, " seconds=", seconds, " (needs >= 1, (0, 60])"));
  }
  int device = 0, optin = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(OccupyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  OccupyKernel<<<static_cast<unsigned>(ctas), 32, static_cast<size_t>(optin), AsCuda(stream)>>>(
      static_cast<uint64_t>(seconds * 1e9));
  return CheckLastLaunch("OccupySms");
}

absl::StatusOr<int> OccupyKernelCtasPerSm() {
  int per_sm = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, OccupyKernel, 32, 0));
  return per_sm;
}

}  // namespace tessera::kernels::cuda
