#include "kernels/cpu/host_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::kernels::cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

absl::StatusOr<HostBuffer> HostBuffer::Allocate(size_t bytes) {
  HostBuffer buffer;
  if (bytes == 0) return buffer;
  const size_t size = RoundUp(bytes, kHugePage);
  // Map one huge page more than needed, then trim to a 2 MiB aligned range.
  const size_t mapped = size + kHugePage;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes of host memory: ", std::strerror(errno)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + mapped;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  buffer.data_ = reinterpret_cast<void*>(aligned);
  buffer.size_ = bytes;
  buffer.mapped_ = size;
#ifdef MADV_HUGEPAGE
  buffer.huge_pages_advised_ = madvise(buffer.data_, size, MADV_HUGEPAGE) == 0;
#endif
  return buffer;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_pages_advised_ = std::exchange(other.huge_pages_advised_, false);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
}

}  // namespace tessera::kernels::cpu
