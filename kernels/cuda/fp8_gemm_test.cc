// The FP8 prefill paths (fp8_gemm.h) against the CPU reference
// (kernels/cpu/fp8_linear.h): weight dequantization and activation
// quantize-dequantize bit for bit (one bf16 rounding of the exact value),
// and cuBLASLt's block-scaled FP8 GEMM on Hopper (skipped elsewhere) with
// per-token-group-128 activation scales and 128x128 weight scales, on a
// shape with a partial last block and on a Llama-3-8B projection. This test
// also confirms the scale layouts fp8_gemm.h gives cuBLASLt.
//
// Tolerance (GEMM): |y - ref| <= 1e-3 * sum_i |xq xs w ws| + 2^-8 |ref|
// (one bf16 rounding; the rest is the tensor cores' reduced-precision
// accumulation within a 128-deep block: measured on an H200 at up to
// 1.8e-4 of sum |x w|, so the bound has 5x headroom, while a scale-layout
// error misses it by two orders of magnitude).
#include "kernels/cuda/fp8_gemm.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/fp8_linear.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_query.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::FromBf16;
using cuda_testing::RandomBf16Floats;
using cuda_testing::RandomFloats;
using cuda_testing::ToBf16;
using cuda_testing::Upload;
using cuda_testing::Zeros;
namespace kc = ::tessera::kernels::cpu;

float RoundBf16(float v) { return kc::Bf16ToF32(kc::F32ToBf16(v)); }

TEST(Fp8PrefillTest, DequantizedWeightsAreExactThenRoundedOnce) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t n = 200, k = 304, rows = 2, cols = 3;
  std::vector<uint8_t> w;
  for (float v : RandomFloats(n * k, 3, -440.f, 440.f)) w.push_back(kc::FloatToE4m3(v));
  const std::vector<float> grid = RandomFloats(rows * cols, 5, 1e-3f, 3e-3f);
  DeviceBuffer d_w = Upload(w), d_grid = Upload(grid), d_out = Zeros(n * k * sizeof(Bf16));
  Fp8DeviceWeight dw{d_w.as<uint8_t>(), n, k, d_grid.as<float>(), kFp8Block, kFp8Block};
  ASSERT_TRUE(Fp8DequantizeWeightBf16(dw, d_out.as<Bf16>(), nullptr).ok());
  const std::vector<float> got = FromBf16(Download<Bf16>(d_out, n * k));
  for (int64_t o = 0; o < n; ++o) {
    for (int64_t i = 0; i < k; ++i) {
      const float want =
          RoundBf16(kc::E4m3ToFloat(w[o * k + i]) * grid[(o / 128) * cols + i / 128]);
      ASSERT_EQ(got[o * k + i], want) << o << "," << i;
    }
  }
}

TEST(Fp8PrefillTest, ActivationsRoundTripThroughE4m3AsTheReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t m = 5, k = 300;
  const std::vector<float> x = RandomBf16Floats(m * k, 7, -4.f, 4.f);
  DeviceBuffer d_x = Upload(ToBf16(x)), d_out = Zeros(m * k * sizeof(Bf16));
  ASSERT_TRUE(Fp8QuantizeDequantizeBf16(d_x.as<Bf16>(), m, k, {kFp8Block, nullptr},
                                        d_out.as<Bf16>(), nullptr)
                  .ok());
  std::vector<float> xq(m * k), xs(m * 3);
  kc::QuantizeActivations(x.data(), m, k, {kc::Fp8ActivationMode::kDynamicGroup, 128, 1.f},
                          xq.data(), xs.data());
  const std::vector<float> got = FromBf16(Download<Bf16>(d_out, m * k));
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(got[t * k + i], RoundBf16(xq[t * k + i] * xs[t * 3 + i / 128])) << t << "," << i;
    }
  }
}

bool IsHopper() {
  const CudaQueryResult q = QueryCudaDevices();
  return !q.info.devices.empty() && q.info.devices[0].sm_major == 9;
}

struct GemmCase {
  int64_t m, n, k;
};

class Fp8BlockGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Fp8BlockGemmTest, MatchesTheCpuReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  if (!IsHopper()) GTEST_SKIP() << "cuBLASLt's 128-block FP8 scaling runs on SM 9.x only";
  const auto [m, n, k] = GetParam();
  const int64_t rows = (n + 127) / 128, cols = (k + 127) / 128;
  const std::vector<float> x = RandomBf16Floats(m * k, 11, -3.f, 3.f);
  std::vector<uint8_t> w;
  for (float v : RandomFloats(n * k, 13, -440.f, 440.f)) w.push_back(kc::FloatToE4m3(v));
  const std::vector<float> grid = RandomFloats(rows * cols, 17, 1e-3f, 3e-3f);

  DeviceBuffer d_x = Upload(ToBf16(x)), d_xq = Zeros(m * k), d_xs = Zeros(m * cols * 4);
  ASSERT_TRUE(Fp8QuantizeActivations(d_x.as<Bf16>(), m, k, {kFp8Block, nullptr}, d_xq.as<uint8_t>(),
                                     d_xs.as<float>(), nullptr)
                  .ok());
  DeviceBuffer d_w = Upload(w), d_scales = Upload(grid);
  DeviceBuffer d_y = Zeros(m * n * sizeof(Bf16));
  absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> gemm = Fp8BlockGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const absl::Status run = (*gemm)->Run(d_xq.as<uint8_t>(), d_xs.as<float>(), m, d_w.as<uint8_t>(),
                                        d_scales.as<float>(), n, k, d_y.as<Bf16>(), nullptr);
  ASSERT_TRUE(run.ok()) << run;
  const std::vector<float> got = FromBf16(Download<Bf16>(d_y, m * n));

  std::vector<float> per_row(n * cols);
  for (int64_t o = 0; o < n; ++o) {
    for (int64_t j = 0; j < cols; ++j) per_row[o * cols + j] = grid[(o / 128) * cols + j];
  }
  const kc::Fp8Activation act{kc::Fp8ActivationMode::kDynamicGroup, 128, 1.f};
  std::vector<float> xq(m * k), xs(m * cols);
  kc::QuantizeActivations(x.data(), m, k, act, xq.data(), xs.data());
  const int64_t step = m * n > 100000 ? 13 : 1;
  for (int64_t t = 0; t < m; t += (m > 64 ? 7 : 1)) {
    for (int64_t o = 0; o < n; o += step) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double v = double{xq[t * k + i]} * xs[t * cols + i / 128] *
                         kc::E4m3ToFloat(w[o * k + i]) * per_row[o * cols + i / 128];
        ref += v;
        mag += std::abs(v);
      }
      ASSERT_NEAR(got[t * n + o], ref, 1e-3 * mag + std::abs(ref) / 256.0 + 1e-6)
          << "token " << t << " row " << o << " (a layout error of the scales shows here)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8BlockGemmTest,
                         ::testing::Values(GemmCase{64, 272, 640},     // partial last block
                                           GemmCase{256, 4096, 4096},  // Llama-3-8B o_proj
                                           GemmCase{128, 1024, 4096}));

TEST(Fp8PrefillValidation, RefusesBadArguments) {
  Fp8DeviceWeight w;
  Bf16 out[4];
  EXPECT_EQ(Fp8DequantizeWeightBf16(w, out, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8QuantizeDequantizeBf16(nullptr, 1, 128, {}, out, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::kernels::cuda
