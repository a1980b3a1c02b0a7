// Pinned host memory and double-buffered staging (see pinned_buffer.h).
#include "kernels/cuda/pinned_buffer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot pin ", bytes, " bytes of host memory: ", cudaGetErrorName(err), " (",
                     cudaGetErrorString(err), ")"));
  }
  b.data_ = p;
  b.size_ = bytes;
  return b;
}

absl::StatusOr<PinnedStaging> PinnedStaging::Create(size_t bytes) {
  PinnedStaging s;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<PinnedBuffer> b = PinnedBuffer::Allocate(bytes);
    if (!b.ok()) return b.status();
    s.buffers_[i] = std::move(*b);
    absl::StatusOr<Event> e = Event::Create(/*timing=*/false);
    if (!e.ok()) return e.status();
    s.copied_[i] = std::move(*e);
  }
  return s;
}

absl::StatusOr<std::byte*> PinnedStaging::Next() {
  if (buffers_[next_].data() == nullptr) {
    return absl::FailedPreconditionError("PinnedStaging::Next on empty staging buffers");
  }
  // An event never recorded has nothing to wait for.
  if (absl::Status s = copied_[next_].Synchronize(); !s.ok()) return s;
  filling_ = true;
  return static_cast<std::byte*>(buffers_[next_].data());
}

absl::Status PinnedStaging::CopyToDevice(void* dst, size_t bytes, CudaStream stream) {
  if (!filling_) {
    return absl::FailedPreconditionError("PinnedStaging::CopyToDevice without Next() before it");
  }
  if (bytes > buffers_[next_].size()) {
    return absl::InvalidArgumentError(absl::StrCat("PinnedStaging::CopyToDevice of ", bytes,
                                                   " bytes from a buffer of ",
                                                   buffers_[next_].size()));
  }
  filling_ = false;
  if (absl::Status s =
          ::tessera::kernels::cuda::CopyToDevice(dst, buffers_[next_].data(), bytes, stream);
      !s.ok()) {
    return s;
  }
  absl::Status recorded = copied_[next_].Record(stream);
  next_ ^= 1;
  return recorded;
}

}  // namespace tessera::kernels::cuda
