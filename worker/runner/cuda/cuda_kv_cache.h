// CudaKvCache: the paged bf16 K and V caches of every layer on one GPU,
// [layers][blocks, block_size, kv_heads, head_dim] each, sized by a block
// count or by a fraction of the memory left after weights and workspace.
//
// Thread-safety: not thread-safe; one runner's thread uses it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::runner {

class CudaKvCache {
 public:
  struct Shape {
    int64_t layers = 0;
    int block_size = 16;
    int64_t row = 0;  // kv_heads * head_dim of this rank
  };
  // `num_blocks` > 0: that many; else `memory_fraction` of the free device
  // memory. RESOURCE_EXHAUSTED when not even one block fits.
  static absl::StatusOr<CudaKvCache> Create(const Shape& shape, int64_t num_blocks,
                                            double memory_fraction,
                                            kernels::cuda::CudaStream stream);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return num_blocks_ * shape_.block_size; }
  int64_t bytes() const { return static_cast<int64_t>(k_.size() + v_.size()); }
  kernels::cuda::Bf16* k(int64_t layer) const {
    return k_.as<kernels::cuda::Bf16>() + layer * num_slots() * shape_.row;
  }
  kernels::cuda::Bf16* v(int64_t layer) const {
    return v_.as<kernels::cuda::Bf16>() + layer * num_slots() * shape_.row;
  }

  // K/V of slot from[i] copied to slot to[i] in every layer (one kernel);
  // INVALID_ARGUMENT for mismatched spans or slots outside the cache.
  absl::Status CopySlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to,
                         kernels::cuda::CudaStream stream);

 private:
  Shape shape_;
  int64_t num_blocks_ = 0;
  kernels::cuda::DeviceBuffer k_, v_;
  kernels::cuda::DeviceBuffer pairs_;  // CopySlots' staged (from, to) pairs
  std::vector<int64_t> host_pairs_;
};

}  // namespace tessera::runner
