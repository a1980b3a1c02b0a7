#include "worker/runner/cuda/cuda_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/kv_slot_copy.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {

namespace kcu = ::tessera::kernels::cuda;

absl::StatusOr<CudaKvCache> CudaKvCache::Create(const Shape& shape, int64_t num_blocks,
                                                double memory_fraction, kcu::CudaStream stream) {
  CudaKvCache c;
  c.shape_ = shape;
  const int64_t bytes_per_block =
      int64_t{2} * shape.layers * shape.block_size * shape.row * int64_t{sizeof(kcu::Bf16)};
  int64_t blocks = num_blocks;
  if (blocks <= 0) {
    size_t free_bytes = 0, total_bytes = 0;
    if (!kcu::CurrentDeviceMemory(&free_bytes, &total_bytes)) {
      return absl::InternalError("cudaMemGetInfo failed");
    }
    const double budget = static_cast<double>(free_bytes) * memory_fraction;
    blocks = static_cast<int64_t>(budget / static_cast<double>(bytes_per_block));
    if (blocks < 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no GPU memory left for the KV cache: ", free_bytes >> 20,
                       " MiB free; one block needs ", bytes_per_block >> 10, " KiB"));
    }
  }
  c.num_blocks_ = blocks;
  const size_t half = static_cast<size_t>(bytes_per_block / 2) * static_cast<size_t>(blocks);
  absl::StatusOr<kcu::DeviceBuffer> k = AllocateDevice(half, "K cache");
  if (!k.ok()) return k.status();
  absl::StatusOr<kcu::DeviceBuffer> v = AllocateDevice(half, "V cache");
  if (!v.ok()) return v.status();
  c.k_ = std::move(*k);
  c.v_ = std::move(*v);
  RETURN_IF_ERROR(kcu::MemsetDevice(c.k_.data(), 0, half, stream));
  RETURN_IF_ERROR(kcu::MemsetDevice(c.v_.data(), 0, half, stream));
  RETURN_IF_ERROR(kcu::Synchronize(stream));
  return c;
}

absl::Status CudaKvCache::CopySlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to,
                                    kcu::CudaStream stream) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvSlots: ", from.size(), " sources but ", to.size(), " destinations"));
  }
  const int64_t slots = num_slots();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] < 0 || from[i] >= slots || to[i] < 0 || to[i] >= slots) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKvSlots: slot pair ", i, " (", from[i],
                                                     " -> ", to[i], ") outside the cache of ",
                                                     slots, " slots"));
    }
  }
  if (from.empty()) return absl::OkStatus();
  const size_t pairs = from.size();
  const size_t bytes = 2 * pairs * sizeof(int64_t);
  if (bytes > pairs_.size()) {
    RETURN_IF_ERROR(kcu::Synchronize(stream));  // an earlier copy may still read the old buffer
    pairs_ = kcu::DeviceBuffer();
    absl::StatusOr<kcu::DeviceBuffer> buf =
        AllocateDevice(std::max<size_t>(bytes, 1024), "KV slot copy pairs");
    if (!buf.ok()) return buf.status();
    pairs_ = std::move(*buf);
  }
  // One staging copy: the sources, then the destinations.
  host_pairs_.assign(from.begin(), from.end());
  host_pairs_.insert(host_pairs_.end(), to.begin(), to.end());
  RETURN_IF_ERROR(kcu::CopyToDevice(pairs_.data(), host_pairs_.data(), bytes, stream));
  const int64_t* dev = pairs_.as<int64_t>();
  return kcu::CopyKvCacheSlots(k_.as<kcu::Bf16>(), v_.as<kcu::Bf16>(), shape_.layers,
                               slots * shape_.row, shape_.row, dev, dev + pairs,
                               static_cast<int64_t>(pairs), stream);
}

}  // namespace tessera::runner
