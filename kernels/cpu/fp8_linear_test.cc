// e4m3fn conversions and the CPU FP8 linear (fp8_linear.h): the threaded
// kernel against the plain reference, and both against an independent
// double-precision product of the dequantized operands.
//
// Tolerances: optimized vs reference 1e-6 relative to the output scale (the
// same chunked sums, split over threads only); vs the double product of
// dequantized x and W 1e-5 relative (fp32 rounding of partial sums).
#include "kernels/cpu/fp8_linear.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::kernels::cpu {
namespace {

TEST(E4m3Test, KnownValues) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xFE), -448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
  EXPECT_EQ(FloatToE4m3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4m3(-448.0f), 0xFE);
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7E);     // the tie between 448 and 480 goes to even
  EXPECT_EQ(FloatToE4m3(465.0f), 0x7F);     // beyond: NaN, as torch
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);    // tie 1 / 1.125 -> even (1)
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3A);    // tie 1.125 / 1.25 -> even (1.25)
  EXPECT_EQ(FloatToE4m3(0x1p-10f), 0x00);   // half the smallest subnormal -> even (0)
  EXPECT_EQ(FloatToE4m3(0x1.8p-9f), 0x02);  // 1.5 subnormal units -> 2
  EXPECT_EQ(FloatToE4m3(std::nanf("")), 0x7F);
}

TEST(E4m3Test, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const float v = E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    if (v == 0.0f) {
      EXPECT_EQ(E4m3ToFloat(FloatToE4m3(v)), 0.0f);
      continue;
    }
    EXPECT_EQ(FloatToE4m3(v), code) << v;
  }
}

struct Problem {
  int64_t m, rows, cols, scale_block;
  Fp8Activation act;
};

struct Data {
  std::vector<float> x, scales, bias;
  std::vector<uint8_t> w;
  Fp8WeightMatrix matrix;
};

Data Make(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Data d;
  d.x.resize(p.m * p.cols);
  for (float& v : d.x) v = u(rng) * 3.f;
  d.w.resize(p.rows * p.cols);
  for (uint8_t& v : d.w) v = FloatToE4m3(u(rng) * 400.f);
  d.matrix = {d.w.data(), p.rows, p.cols, nullptr, p.scale_block};
  d.scales.resize(p.rows * d.matrix.scale_cols());
  for (float& v : d.scales) v = 1e-3f * (1.5f + u(rng));
  d.matrix.scales = d.scales.data();
  d.bias.resize(p.rows);
  for (float& v : d.bias) v = u(rng);
  return d;
}

// The double-precision product of the dequantized operands.
std::vector<double> Dequantized(const Problem& p, const Data& d) {
  const int64_t group = ActivationGroup(p.act, p.cols);
  const int64_t groups = (p.cols + group - 1) / group;
  std::vector<float> xq(p.m * p.cols), xs(p.m * groups);
  QuantizeActivations(d.x.data(), p.m, p.cols, p.act, xq.data(), xs.data());
  std::vector<double> y(p.m * p.rows);
  for (int64_t t = 0; t < p.m; ++t) {
    for (int64_t o = 0; o < p.rows; ++o) {
      double acc = d.bias[o];
      for (int64_t i = 0; i < p.cols; ++i) {
        const double x = double{xq[t * p.cols + i]} * xs[t * groups + i / group];
        const double w = double{E4m3ToFloat(d.w[o * p.cols + i])} *
                         d.scales[o * d.matrix.scale_cols() + i / p.scale_block];
        acc += x * w;
      }
      y[t * p.rows + o] = acc;
    }
  }
  return y;
}

class Fp8GemmTest : public ::testing::TestWithParam<Problem> {};

TEST_P(Fp8GemmTest, OptimizedReferenceAndDequantizedAgree) {
  const Problem& p = GetParam();
  Data d = Make(p, 7);
  ASSERT_TRUE(ValidateFp8Gemm(d.matrix, p.act).ok());
  const int64_t ldy = p.rows + 3;  // a strided output, as for fused parts
  std::vector<float> got(p.m * ldy, -7.f), want(p.m * ldy, -7.f);
  ThreadPool pool(3);
  Fp8Gemm(CpuContext{&pool, CpuIsa::kScalar}, d.x.data(), p.m, d.matrix, p.act, d.bias.data(),
          got.data(), ldy);
  reference::Fp8Gemm(d.x.data(), p.m, d.matrix, p.act, d.bias.data(), want.data(), ldy);
  std::vector<double> exact = Dequantized(p, d);
  double scale = 1;
  for (double v : exact) scale = std::max(scale, std::abs(v));
  for (int64_t t = 0; t < p.m; ++t) {
    for (int64_t o = 0; o < p.rows; ++o) {
      const float g = got[t * ldy + o], w = want[t * ldy + o];
      EXPECT_NEAR(g, w, 1e-6 * scale) << t << "," << o;
      EXPECT_NEAR(w, exact[t * p.rows + o], 1e-5 * scale) << t << "," << o;
    }
    for (int64_t o = p.rows; o < ldy; ++o) EXPECT_EQ(got[t * ldy + o], -7.f);  // untouched
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8GemmTest,
    ::testing::Values(
        // Fine-grained: 128 x 128 blocks, per-token groups of 128; partial last blocks.
        Problem{1, 200, 300, 128, {Fp8ActivationMode::kDynamicGroup, 128, 1}},
        Problem{5, 130, 256, 128, {Fp8ActivationMode::kDynamicGroup, 128, 1}},
        // compressed-tensors: channel / tensor weights, per-token or static activations.
        Problem{3, 70, 300, 300, {Fp8ActivationMode::kDynamicToken, 128, 1}},
        Problem{4, 64, 96, 96, {Fp8ActivationMode::kStatic, 128, 0.02f}},
        Problem{2, 33, 257, 128, {Fp8ActivationMode::kDynamicToken, 128, 1}},
        Problem{2, 40, 200, 200, {Fp8ActivationMode::kNone, 128, 1}}));

TEST(Fp8QuantizeTest, DynamicGroupsScaleToTheirMaximum) {
  std::vector<float> x(260);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i) * (i < 128 ? 1.f : 50.f);
  for (size_t i = 256; i < 260; ++i) x[i] = 0;  // an all-zero last group
  std::vector<float> xq(260), xs(3);
  QuantizeActivations(x.data(), 1, 260, {Fp8ActivationMode::kDynamicGroup, 128, 1}, xq.data(),
                      xs.data());
  for (int g = 0; g < 2; ++g) {
    float amax = 0, qmax = 0;
    for (int i = g * 128; i < (g + 1) * 128; ++i) {
      amax = std::max(amax, std::abs(x[i]));
      qmax = std::max(qmax, std::abs(xq[i]));
    }
    EXPECT_FLOAT_EQ(xs[g], amax / 448.f);
    EXPECT_EQ(qmax, 448.f);  // the largest element maps to the e4m3 maximum
  }
  for (int i = 256; i < 260; ++i) EXPECT_EQ(xq[i], 0.f);
  EXPECT_GT(xs[2], 0.f);
}

TEST(Fp8QuantizeTest, StaticClampsToTheFormat) {
  const std::vector<float> x = {1.01f, -100.f, 0.013f};
  std::vector<float> xq(3), xs(1);
  QuantizeActivations(x.data(), 1, 3, {Fp8ActivationMode::kStatic, 128, 0.01f}, xq.data(),
                      xs.data());
  EXPECT_EQ(xq[0], 104.f);   // 101: e4m3 steps by 8 in [64, 128)
  EXPECT_EQ(xq[1], -448.f);  // -10000 clamped
  EXPECT_EQ(xq[2], 1.25f);   // 1.3 -> 1.25
  EXPECT_EQ(xs[0], 0.01f);
}

TEST(Fp8GemmValidateTest, RejectsBadArguments) {
  std::vector<uint8_t> w(4);
  std::vector<float> s(4);
  Fp8WeightMatrix m{w.data(), 2, 2, s.data(), 2};
  EXPECT_TRUE(ValidateFp8Gemm(m, {}).ok());
  m.scales = nullptr;
  EXPECT_FALSE(ValidateFp8Gemm(m, {}).ok());
  std::vector<uint8_t> big(300 * 2);
  std::vector<float> bs(2 * 3);
  Fp8WeightMatrix odd{big.data(), 2, 300, bs.data(), 100};
  EXPECT_FALSE(ValidateFp8Gemm(odd, {Fp8ActivationMode::kDynamicGroup, 128, 1}).ok());
  EXPECT_FALSE(ValidateFp8Gemm(m, {Fp8ActivationMode::kStatic, 128, 0.f}).ok());
}

}  // namespace
}  // namespace tessera::kernels::cpu
