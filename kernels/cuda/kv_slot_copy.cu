// KV-cache slot copies (see kv_slot_copy.h).
//
// Grid (row chunks, layer, K|V); each thread owns one 16-byte chunk (8 bf16)
// of a slot row and walks the pairs in order. Every pair touching that
// chunk of a layer's K or V goes through the same thread, so a pair reads
// exactly what the earlier pairs wrote without any synchronisation.
//
// Thread-safety: see the header.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_slot_copy.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    CopySlotsKernel(uint16_t* __restrict__ k_cache, uint16_t* __restrict__ v_cache,
                    int64_t layer_elems, int64_t row_chunks, const int64_t* __restrict__ from,
                    const int64_t* __restrict__ to, int64_t pairs) {
  const int64_t chunk = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (chunk >= row_chunks) return;
  uint16_t* base = (blockIdx.z == 0 ? k_cache : v_cache) + int64_t{blockIdx.y} * layer_elems;
  uint4* rows = reinterpret_cast<uint4*>(base);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t src = from[i], dst = to[i];
    if (src == dst) continue;
    // Same pointer, same thread: a later load sees the earlier store.
    rows[dst * row_chunks + chunk] = rows[src * row_chunks + chunk];
  }
}

}  // namespace

absl::Status CopyKvCacheSlots(Bf16* k_cache, Bf16* v_cache, int64_t num_layers, int64_t layer_elems,
                              int64_t row_elems, const int64_t* from, const int64_t* to,
                              int64_t pairs, CudaStream stream) {
  if (num_layers < 0 || layer_elems < 0 || row_elems <= 0 || pairs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvCacheSlots: bad shape layers=", num_layers,
                     " layer_elems=", layer_elems, " row_elems=", row_elems, " pairs=", pairs));
  }
  if (row_elems % 8 != 0 || layer_elems % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CopyKvCacheSlots: row_elems ", row_elems,
                                                   " and layer_elems must be multiples of 8"));
  }
  if (num_layers > 65535) {
    return absl::InvalidArgumentError("CopyKvCacheSlots: more than 65535 layers");
  }
  if (pairs == 0 || num_layers == 0) return absl::OkStatus();
  if (k_cache == nullptr || v_cache == nullptr || from == nullptr || to == nullptr) {
    return absl::InvalidArgumentError("CopyKvCacheSlots: null pointer");
  }
  if (reinterpret_cast<uintptr_t>(k_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(v_cache) % 16 != 0) {
    return absl::InvalidArgumentError("CopyKvCacheSlots: caches must be 16-byte aligned");
  }
  const int64_t row_chunks = row_elems / 8;
  const dim3 grid(static_cast<unsigned>((row_chunks + kThreads - 1) / kThreads),
                  static_cast<unsigned>(num_layers), 2);
  CopySlotsKernel<<<grid, kThreads, 0, AsCuda(stream)>>>(k_cache, v_cache, layer_elems, row_chunks,
                                                         from, to, pairs);
  return CheckLastLaunch("CopyKvCacheSlots");
}

}  // namespace tessera::kernels::cuda
