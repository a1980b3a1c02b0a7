// Test helpers for the CUDA kernel tests: skip without a device, upload and
// download vectors, deterministic random data. Plain C++ (device_buffer.h).
//
// Thread-safety: none needed (tests are single-threaded).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::kernels::cuda::cuda_testing {

// Skips the current test when the process sees no CUDA device.
#define TESSERA_REQUIRE_CUDA_DEVICE()                                    \
  do {                                                                   \
    std::string tessera_why_;                                            \
    if (::tessera::kernels::cuda::CudaDeviceCount(&tessera_why_) == 0) { \
      GTEST_SKIP() << "no CUDA device: " << tessera_why_;                \
    }                                                                    \
    ASSERT_TRUE(::tessera::kernels::cuda::SetDevice(0).ok());            \
  } while (0)

// Captures what `body` (returning absl::Status) enqueues on `stream` into
// `graph`. EndCapture runs even when the body fails, so the stream leaves
// capture mode; the body's error comes first, then the capture's.
template <class F>
absl::Status CaptureGraph(CudaStream stream, CudaGraph* graph, F&& body) {
  if (absl::Status s = graph->BeginCapture(stream); !s.ok()) return s;
  const absl::Status captured = body();
  const absl::Status ended = graph->EndCapture();
  return captured.ok() ? ended : captured;
}

template <class T>
DeviceBuffer Upload(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(host.size() * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  absl::Status s = CopyToDevice(b->data(), host.data(), host.size() * sizeof(T));
  EXPECT_TRUE(s.ok()) << s;
  s = Synchronize(nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return std::move(*b);
}

template <class T>
std::vector<T> Download(const DeviceBuffer& b, size_t n) {
  std::vector<T> host(n);
  EXPECT_GE(b.size(), n * sizeof(T));
  absl::Status s = SynchronizeDevice();
  EXPECT_TRUE(s.ok()) << s;
  s = CopyToHost(host.data(), b.data(), n * sizeof(T));
  EXPECT_TRUE(s.ok()) << s;
  s = Synchronize(nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return host;
}

inline DeviceBuffer Zeros(size_t bytes) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  EXPECT_TRUE(MemsetDevice(b->data(), 0, bytes).ok());
  EXPECT_TRUE(Synchronize(nullptr).ok());
  return std::move(*b);
}

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values already representable in bf16 (so fp32 references see the same
// inputs as the bf16 kernels).
inline std::vector<float> RandomBf16Floats(size_t n, uint32_t seed, float lo = -1.f,
                                           float hi = 1.f) {
  std::vector<float> v = RandomFloats(n, seed, lo, hi);
  for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return v;
}

// Fast deterministic bf16 fill in [-1, 1) (std::mt19937 is too slow for
// hundreds of millions of values).
inline std::vector<Bf16> FastRandomBf16(size_t n, uint64_t seed) {
  std::vector<Bf16> out(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float f = static_cast<float>(static_cast<int32_t>(s >> 40) - (1 << 23)) / (1 << 23);
    out[i] = FloatToBf16(f);
  }
  return out;
}

inline std::vector<Bf16> ToBf16(const std::vector<float>& v) {
  std::vector<Bf16> out;
  EXPECT_TRUE(ConvertToBf16(v.data(), v.size(), &out).ok());
  return out;
}

inline std::vector<float> FromBf16(const std::vector<Bf16>& v) {
  std::vector<float> out;
  EXPECT_TRUE(ConvertFromBf16(v.data(), v.size(), &out).ok());
  return out;
}

// bf16 has 8 significant bits: one rounding is within 2^-9 relative.
inline constexpr double kBf16Eps = 1.0 / 256.0;

}  // namespace tessera::kernels::cuda::cuda_testing
