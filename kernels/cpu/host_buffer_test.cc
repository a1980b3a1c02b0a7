#include "kernels/cpu/host_buffer.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace tessera::kernels::cpu {
namespace {

TEST(HostBufferTest, IsZeroedAlignedAndWritable) {
  absl::StatusOr<HostBuffer> b = HostBuffer::Allocate(3 * 1000 * 1000 + 7);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 3u * 1000 * 1000 + 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (2u << 20), 0u);
  const uint8_t* bytes = b->As<uint8_t>();
  for (size_t i = 0; i < b->size(); i += 4093) ASSERT_EQ(bytes[i], 0) << i;
  b->As<uint8_t>()[b->size() - 1] = 42;
  EXPECT_EQ(bytes[b->size() - 1], 42);
}

TEST(HostBufferTest, MoveTransfersOwnership) {
  absl::StatusOr<HostBuffer> a = HostBuffer::Allocate(4096);
  ASSERT_TRUE(a.ok());
  void* p = a->data();
  HostBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(a->size(), 0u);
  HostBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 4096u);
}

TEST(HostBufferTest, ZeroBytesIsEmptyAndHugeSizesFail) {
  absl::StatusOr<HostBuffer> empty = HostBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  absl::StatusOr<HostBuffer> huge = HostBuffer::Allocate(size_t{1} << 62);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tessera::kernels::cpu
