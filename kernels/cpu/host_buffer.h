// Owning, zero-filled host memory for large tensors (weights, KV cache),
// aligned to 2 MiB and advised to use transparent huge pages where the OS
// allows. Paged attention walks one kv head's rows at slot_stride apart
// (often a page or more each); huge pages keep those walks out of the TLB's
// way (about 20% faster decode attention on a 4 KiB-page allocation here).
//
// Thread-safety: a HostBuffer is a move-only value; concurrent reads and
// writes of disjoint bytes are safe.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"

namespace tessera::kernels::cpu {

class HostBuffer {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be mapped; a zero size gives an
  // empty buffer.
  static absl::StatusOr<HostBuffer> Allocate(size_t bytes);

  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* As() const {
    return static_cast<T*>(data_);
  }
  // Whether the kernel accepted the huge-page advice (it may still decline
  // to back the range with huge pages).
  bool huge_pages_advised() const { return huge_pages_advised_; }

 private:
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  bool huge_pages_advised_ = false;
};

}  // namespace tessera::kernels::cpu
