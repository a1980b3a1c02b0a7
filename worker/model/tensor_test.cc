#include "worker/model/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::model {
namespace {

using ::testing::HasSubstr;

// A float32 view over `values` with the given shape.
TensorView ViewOf(const std::vector<float>& values, std::vector<int64_t> shape) {
  TensorView t;
  t.name = "t";
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data = reinterpret_cast<const std::byte*>(values.data());
  t.size_bytes = values.size() * sizeof(float);
  return t;
}

std::vector<float> Iota(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f - 3.0f;
  return v;
}

// Element (i, j, k) of a row-major [A, B, C] tensor.
float At(const std::vector<float>& v, int64_t B, int64_t C, int64_t i, int64_t j, int64_t k) {
  return v[static_cast<size_t>((i * B + j) * C + k)];
}

TEST(TensorSliceTest, EveryDimensionMatchesIndexArithmetic) {
  const int64_t A = 3, B = 5, C = 4;
  std::vector<float> values = Iota(A * B * C);
  TensorView t = ViewOf(values, {A, B, C});
  const int64_t extent[3] = {A, B, C};
  for (int dim = 0; dim < 3; ++dim) {
    for (int64_t start = 0; start < extent[dim]; ++start) {
      for (int64_t len = 0; start + len <= extent[dim]; ++len) {
        absl::StatusOr<std::vector<float>> got = ReadSliceAsFloat32(t, dim, start, len);
        ASSERT_TRUE(got.ok()) << got.status();
        int64_t shape[3] = {A, B, C};
        shape[dim] = len;
        ASSERT_EQ(static_cast<int64_t>(got->size()), shape[0] * shape[1] * shape[2]);
        size_t n = 0;
        for (int64_t i = 0; i < shape[0]; ++i) {
          for (int64_t j = 0; j < shape[1]; ++j) {
            for (int64_t k = 0; k < shape[2]; ++k) {
              int64_t idx[3] = {i, j, k};
              idx[dim] += start;
              EXPECT_EQ((*got)[n++], At(values, B, C, idx[0], idx[1], idx[2]))
                  << "dim " << dim << " start " << start << " len " << len;
            }
          }
        }
        // The raw-byte variant agrees with the converting one.
        std::vector<std::byte> raw(got->size() * sizeof(float));
        ASSERT_TRUE(ReadSlice(t, dim, start, len, absl::MakeSpan(raw)).ok());
        if (!raw.empty()) {
          EXPECT_EQ(std::memcmp(raw.data(), got->data(), raw.size()), 0);
        }
      }
    }
  }
}

TEST(TensorSliceTest, RejectsOutOfRangeSlices) {
  std::vector<float> values = Iota(6);
  TensorView t = ViewOf(values, {2, 3});
  EXPECT_THAT(std::string(ReadSliceAsFloat32(t, 2, 0, 1).status().message()),
              HasSubstr("slice dim 2 is out of range"));
  EXPECT_EQ(ReadSliceAsFloat32(t, 1, 2, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReadSliceAsFloat32(t, 0, -1, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(SliceRows(t, 1, 2).status().code(), absl::StatusCode::kOutOfRange);
  std::vector<std::byte> small(4);
  EXPECT_THAT(std::string(ReadSlice(t, 0, 0, 1, absl::MakeSpan(small)).message()),
              HasSubstr("slice needs 12 bytes but the output holds 4"));
}

TEST(TensorSliceTest, InconsistentViewsAreRejectedNotRead) {
  std::vector<float> values = Iota(4);
  TensorView t = ViewOf(values, {4, 4});  // claims 16 elements, holds 4
  EXPECT_THAT(std::string(ToFloat32(t).status().message()),
              HasSubstr("does not match its 16 bytes"));
  EXPECT_FALSE(ReadSliceAsFloat32(t, 0, 2, 2).ok());
  t.shape = {-4};
  EXPECT_THAT(std::string(ToFloat32(t).status().message()), HasSubstr("invalid shape [-4]"));
}

TEST(TensorSliceTest, SliceRowsIsZeroCopy) {
  std::vector<float> values = Iota(12);
  TensorView t = ViewOf(values, {4, 3});
  absl::StatusOr<TensorView> rows = SliceRows(t, 1, 2);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->data, t.data + 3 * sizeof(float));
  EXPECT_EQ(rows->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(rows->size_bytes, 6 * sizeof(float));
  EXPECT_EQ(rows->name, "t[1:3]");
}

// Rows outside the slice live on pages with no access: reading them would
// fault, so passing proves that only the slice's bytes are touched.
TEST(TensorSliceTest, RowSliceTouchesOnlyItsPages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t floats_per_page = page / sizeof(float);
  void* mem = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  float* f = static_cast<float*>(mem);
  for (size_t i = 0; i < 3 * floats_per_page; ++i) f[i] = static_cast<float>(i);
  const int64_t row = static_cast<int64_t>(floats_per_page / 4);  // 4 rows per page
  TensorView t;
  t.name = "guarded";
  t.dtype = DType::kF32;
  t.shape = {12, row};
  t.data = static_cast<const std::byte*>(mem);
  t.size_bytes = 3 * page;
  ASSERT_EQ(mprotect(mem, page, PROT_NONE), 0);
  ASSERT_EQ(mprotect(static_cast<char*>(mem) + 2 * page, page, PROT_NONE), 0);
  absl::StatusOr<std::vector<float>> mid = ReadSliceAsFloat32(t, 0, 4, 4);
  ASSERT_TRUE(mid.ok()) << mid.status();
  ASSERT_EQ(mid->size(), floats_per_page);
  for (size_t i = 0; i < mid->size(); ++i) {
    EXPECT_EQ((*mid)[i], static_cast<float>(floats_per_page + i));
  }
  munmap(mem, 3 * page);
}

TEST(TensorConvertTest, HalfAndBFloat16Decode) {
  // Bit patterns with their IEEE meaning: 1.0, -2.0, 65504 (max), smallest
  // subnormal 2^-24, +inf.
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
}

TEST(TensorConvertTest, EncodeDecodeRoundTripsEveryHalfAndBFloat16) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float h = HalfToFloat(b);
    if (!std::isnan(h)) {
      EXPECT_EQ(FloatToHalf(h), b) << std::hex << bits;
    }
    const float bf = BFloat16ToFloat(b);
    if (!std::isnan(bf)) {
      EXPECT_EQ(FloatToBFloat16(bf), b) << std::hex << bits;
    }
  }
  // Ties round to even; overflow goes to infinity.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
}

}  // namespace
}  // namespace tessera::model
