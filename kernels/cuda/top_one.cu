#include "kernels/cuda/top_one.h"

#include <cfloat>

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

// (value, index) with the larger value first, then the smaller index.
__device__ __forceinline__ bool Better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void TopOneKernel(const float* logits, int64_t vocab, int64_t offset, int32_t* ids,
                             float* values) {
  const float* row = logits + blockIdx.x * vocab;
  float best = -FLT_MAX;
  int64_t best_i = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v != v) continue;  // NaN
    if (best_i < 0 || Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  // Warp then block reduction.
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_down_sync(0xffffffffu, best, o);
    const int64_t i = __shfl_down_sync(0xffffffffu, best_i, o);
    if (i >= 0 && (best_i < 0 || Better(v, i, best, best_i))) {
      best = v;
      best_i = i;
    }
  }
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (blockDim.x + 31) / 32; ++w) {
      if (si[w] >= 0 && (best_i < 0 || Better(sv[w], si[w], best, best_i))) {
        best = sv[w];
        best_i = si[w];
      }
    }
    ids[blockIdx.x] = best_i < 0 ? -1 : static_cast<int32_t>(best_i + offset);
    values[blockIdx.x] = best;
  }
}

}  // namespace

absl::Status TopOneRows(const float* logits, int64_t rows, int64_t vocab, int64_t index_offset,
                        int32_t* ids, float* values, CudaStream stream) {
  if (rows < 0 || vocab <= 0 ||
      (rows > 0 && (logits == nullptr || ids == nullptr || values == nullptr))) {
    return absl::InvalidArgumentError("TopOneRows: bad sizes or null pointers");
  }
  if (rows == 0) return absl::OkStatus();
  if (rows > 2147483647) return absl::InvalidArgumentError("TopOneRows: too many rows");
  TopOneKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(logits, vocab, index_offset, ids,
                                                                values);
  return CudaError(cudaGetLastError(), "TopOneRows");
}

}  // namespace tessera::kernels::cuda
