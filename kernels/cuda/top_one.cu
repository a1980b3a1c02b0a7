#include "kernels/cuda/top_one.h"

#include <algorithm>
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTargetCtas = 264;  // two per SM on the H200; more only add reduction work
constexpr int64_t kMinPerCta = 4096;  // values per CTA at the least

// (value, index) as one 64-bit key whose unsigned order is "larger value,
// then lower index": the value's bits made monotonic above, the index's
// complement below. 0 means "no value" (a real entry's low word is at least
// 2^31, as indices stay below 2^31).
__device__ __forceinline__ uint64_t Key(float v, int64_t i) {
  uint32_t u = v == 0.f ? 0u : __float_as_uint(v);  // -0.0 ties with +0.0
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ float KeyValue(uint64_t k) {
  const uint32_t u = static_cast<uint32_t>(k >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
__device__ __forceinline__ int64_t KeyIndex(uint64_t k) {
  return 0xffffffffu - static_cast<uint32_t>(k);
}
__device__ __forceinline__ void Consider(float v, int64_t i, uint64_t& best) {
  if (v == v) best = max(best, Key(v, i));  // NaN skipped
}

__device__ __forceinline__ uint64_t BlockMax(uint64_t k) {
  __shared__ uint64_t s[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = k;
  __syncthreads();
  k = threadIdx.x < kThreads / 32 ? s[threadIdx.x] : 0;
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  return k;
}

// CTA (split, row) takes values [split * chunk, (split + 1) * chunk) of its
// row (chunk % 4 == 0) and leaves its best key in part[row * splits + split].
// VEC: rows start 16-byte aligned (logits aligned, vocab % 4 == 0).
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    TopOnePartKernel(const float* logits, int64_t vocab, int64_t chunk, uint64_t* part) {
  const int64_t row = blockIdx.y;
  const float* x = logits + row * vocab;
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = min(vocab, begin + chunk);
  uint64_t best = 0;
  if (VEC) {
    constexpr int kLoads = 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int64_t b4 = begin / 4, e4 = end / 4;  // end % 4 != 0 only at the row's end
    for (int64_t base = b4; base < e4; base += int64_t{kThreads} * kLoads) {
      float4 v[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t c = base + j * kThreads + threadIdx.x;
        v[j] = c < e4 ? __ldg(x4 + c) : make_float4(NAN, NAN, NAN, NAN);
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t i = 4 * (base + j * kThreads + threadIdx.x);
        Consider(v[j].x, i, best);
        Consider(v[j].y, i + 1, best);
        Consider(v[j].z, i + 2, best);
        Consider(v[j].w, i + 3, best);
      }
    }
    for (int64_t i = 4 * e4 + threadIdx.x; i < end; i += kThreads) Consider(x[i], i, best);
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) Consider(__ldg(x + i), i, best);
  }
  best = BlockMax(best);
  if (threadIdx.x == 0) part[row * gridDim.x + blockIdx.x] = best;
}

// One warp per row: the best of the row's `splits` keys.
__global__ void TopOneFinishKernel(const uint64_t* part, int64_t rows, int splits, int64_t offset,
                                   int32_t* ids, float* values) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  uint64_t best = 0;
  for (int s = lane; s < splits; s += 32) best = max(best, part[row * splits + s]);
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) {
    ids[row] = best == 0 ? -1 : static_cast<int32_t>(KeyIndex(best) + offset);
    values[row] = best == 0 ? -FLT_MAX : KeyValue(best);
  }
}

int64_t SplitsFor(int64_t rows, int64_t vocab) {
  const int64_t want = std::max<int64_t>(1, (kTargetCtas + rows - 1) / rows);
  return std::clamp<int64_t>((vocab + kMinPerCta - 1) / kMinPerCta, 1, want);
}

}  // namespace

size_t TopOneWorkspaceBytes(int64_t max_rows) {
  // rows * splits <= rows * ceil(kTargetCtas / rows) < kTargetCtas + rows.
  return static_cast<size_t>(std::max<int64_t>(max_rows, 0) + kTargetCtas) * sizeof(uint64_t);
}

absl::Status TopOneRows(const float* logits, int64_t rows, int64_t vocab, int64_t index_offset,
                        int32_t* ids, float* values, void* workspace, size_t workspace_bytes,
                        CudaStream stream) {
  if (rows < 0 || vocab <= 0 ||
      (rows > 0 && (logits == nullptr || ids == nullptr || values == nullptr))) {
    return absl::InvalidArgumentError("TopOneRows: bad sizes or null pointers");
  }
  if (rows == 0) return absl::OkStatus();
  if (rows > 65535) return absl::InvalidArgumentError("TopOneRows: more than 65535 rows");
  if (vocab >= (int64_t{1} << 31)) return absl::InvalidArgumentError("TopOneRows: vocab >= 2^31");
  if (index_offset + vocab > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("TopOneRows: ids above int32");
  }
  if (workspace == nullptr || workspace_bytes < TopOneWorkspaceBytes(rows)) {
    return absl::InvalidArgumentError(absl::StrCat("TopOneRows: workspace of ", workspace_bytes,
                                                   " bytes, need ", TopOneWorkspaceBytes(rows)));
  }
  int64_t splits = SplitsFor(rows, vocab);
  const int64_t chunk = ((vocab + splits - 1) / splits + 3) / 4 * 4;
  splits = (vocab + chunk - 1) / chunk;
  auto* part = static_cast<uint64_t*>(workspace);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(rows));
  const bool vec = (reinterpret_cast<uintptr_t>(logits) & 15) == 0 && vocab % 4 == 0;
  if (vec) {
    TopOnePartKernel<true><<<grid, kThreads, 0, AsCuda(stream)>>>(logits, vocab, chunk, part);
  } else {
    TopOnePartKernel<false><<<grid, kThreads, 0, AsCuda(stream)>>>(logits, vocab, chunk, part);
  }
  constexpr int kRowsPerCta = 8;
  TopOneFinishKernel<<<static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta),
                       32 * kRowsPerCta, 0, AsCuda(stream)>>>(part, rows, static_cast<int>(splits),
                                                              index_offset, ids, values);
  return CudaError(cudaGetLastError(), "TopOneRows");
}

}  // namespace tessera::kernels::cuda
