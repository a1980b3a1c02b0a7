// Page-locked (pinned) host memory for copies that really run
// asynchronously: a cudaMemcpyAsync from or to pageable memory may wait for
// the stream (the driver stages it), which would make a "queued" step wait
// for the one before it. PinnedBuffer owns one allocation; PinnedStaging is
// two of them used in turn for host-to-device staging, so that the host can
// fill step N+1's inputs while the copy of step N's may still be queued.
//
// Thread-safety: move-only owners without internal locking (one owner at a
// time), like device_buffer.h's types.
#pragma once

#include <array>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::kernels::cuda {

// Owning cudaHostAlloc allocation (portable: usable with every device).
// Empty when default-constructed or moved from.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // bytes == 0 gives an empty buffer (data() == nullptr). RESOURCE_EXHAUSTED
  // naming the size when the host cannot pin that much.
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Two pinned buffers of `bytes` each, filled and copied to the device in
// turn:
//   std::byte* host = staging.Next();      // waits until it is free again
//   ...fill host...
//   staging.CopyToDevice(dst, n, stream);  // queues the copy from it
// Next() hands out the buffer the last CopyToDevice did not use, once the
// copy queued from it before has completed (normally long ago: a wait here
// only happens when the host runs two steps ahead of the device).
class PinnedStaging {
 public:
  PinnedStaging() = default;
  static absl::StatusOr<PinnedStaging> Create(size_t bytes);

  size_t size() const { return buffers_[0].size(); }
  // The buffer to fill next. INTERNAL when the wait for its last copy fails
  // (a device error).
  absl::StatusOr<std::byte*> Next();
  // Queues the copy of the first `bytes` of the buffer Next() returned to
  // device memory `dst` on `stream`, and marks that buffer busy until the
  // copy has run. FAILED_PRECONDITION without a Next() before it;
  // INVALID_ARGUMENT for more bytes than a buffer holds.
  absl::Status CopyToDevice(void* dst, size_t bytes, CudaStream stream);

 private:
  std::array<PinnedBuffer, 2> buffers_;
  std::array<Event, 2> copied_;  // recorded after each buffer's last copy
  int next_ = 0;                 // the buffer Next() hands out
  bool filling_ = false;         // Next() was called, CopyToDevice not yet
};

}  // namespace tessera::kernels::cuda
