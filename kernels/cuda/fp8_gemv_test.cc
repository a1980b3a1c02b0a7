// The FP8 decode kernels (fp8_gemv.h) against the CPU reference
// (kernels/cpu/fp8_linear.h): activation quantization bit for bit (e4m3
// codes and fp32 scales), and the GEMV for 1..8 tokens over block (128x128),
// channel and tensor weight scales, per-group, per-token and static
// activation scales, shapes with partial last chunks and a Llama-3-8B
// projection. Skipped without a CUDA device; the argument checks run on
// the host.
//
// Tolerance: |y - ref| <= 1e-5 * sum_i |xq_i xs w_i ws| + 2^-8 |ref| (the
// same partial sums in another order, then one bf16 rounding of y).
#include "kernels/cuda/fp8_gemv.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/fp8_linear.h"
#include "kernels/cuda/cuda_test_util.h"

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

enum class Scales { kBlock, kChannel, kTensor };

struct Case {
  int64_t m, n, k;
  Scales scales;
  int64_t group;  // 128 or k (0 = k)
  bool static_act;
};

struct Host {
  std::vector<float> x;        // bf16-representable
  std::vector<uint8_t> w;      // e4m3 [n, k]
  std::vector<float> grid;     // the device's scale grid
  std::vector<float> per_row;  // the CPU's [n, scale_cols] expansion
  std::vector<float> bias;
  Fp8DeviceWeight dev;  // shapes and blocks (pointers set later)
  kc::Fp8WeightMatrix cpu;
  kc::Fp8Activation act;
};

Host Make(const Case& c) {
  Host h;
  const int64_t group = c.group == 0 ? c.k : c.group;
  h.x = RandomBf16Floats(c.m * c.k, 3 + c.n, -3.f, 3.f);
  for (float v : RandomFloats(c.n * c.k, 5 + c.k, -440.f, 440.f)) h.w.push_back(kc::FloatToE4m3(v));
  h.dev.n = c.n;
  h.dev.k = c.k;
  h.dev.block = c.scales == Scales::kBlock ? kFp8Block : c.k;
  h.dev.row_block = c.scales == Scales::kBlock ? kFp8Block : c.scales == Scales::kChannel ? 1 : c.n;
  const int64_t grid_rows = (c.n + h.dev.row_block - 1) / h.dev.row_block;
  h.grid = RandomFloats(grid_rows * h.dev.scale_cols(), 9, 1e-3f, 3e-3f);
  h.per_row.resize(c.n * h.dev.scale_cols());
  for (int64_t o = 0; o < c.n; ++o) {
    for (int64_t j = 0; j < h.dev.scale_cols(); ++j) {
      h.per_row[o * h.dev.scale_cols() + j] =
          h.grid[(o / h.dev.row_block) * h.dev.scale_cols() + j];
    }
  }
  h.bias = RandomFloats(c.n, 11);
  h.cpu = {h.w.data(), c.n, c.k, h.per_row.data(), h.dev.block};
  h.act = c.static_act   ? kc::Fp8Activation{kc::Fp8ActivationMode::kStatic, 0, 0.01f}
          : group == c.k ? kc::Fp8Activation{kc::Fp8ActivationMode::kDynamicToken, 0, 1.f}
                         : kc::Fp8Activation{kc::Fp8ActivationMode::kDynamicGroup, group, 1.f};
  return h;
}

class Fp8GemvTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8GemvTest, MatchesTheCpuReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const Case& c = GetParam();
  Host h = Make(c);
  const int64_t group = c.static_act || c.group == 0 ? c.k : c.group;
  const int64_t groups = (c.k + group - 1) / group;

  // Quantization: the same e4m3 codes and scales as the CPU.
  DeviceBuffer d_x = Upload(ToBf16(h.x));
  DeviceBuffer d_xq = Zeros(c.m * c.k), d_xs = Zeros(c.m * groups * sizeof(float));
  DeviceBuffer d_static = Upload(std::vector<float>{h.act.static_scale});
  Fp8ActivationQuant quant{group, c.static_act ? d_static.as<float>() : nullptr};
  ASSERT_TRUE(Fp8QuantizeActivations(d_x.as<Bf16>(), c.m, c.k, quant, d_xq.as<uint8_t>(),
                                     d_xs.as<float>(), nullptr)
                  .ok());
  std::vector<float> want_q(c.m * c.k), want_s(c.m * groups);
  kc::QuantizeActivations(h.x.data(), c.m, c.k, h.act, want_q.data(), want_s.data());
  const std::vector<uint8_t> got_q = Download<uint8_t>(d_xq, c.m * c.k);
  const std::vector<float> got_s = Download<float>(d_xs, c.m * groups);
  for (int64_t i = 0; i < c.m * c.k; ++i) {
    ASSERT_EQ(kc::E4m3ToFloat(got_q[i]), want_q[i]) << "element " << i;
  }
  for (int64_t i = 0; i < c.m * groups; ++i) ASSERT_EQ(got_s[i], want_s[i]) << "scale " << i;

  // The GEMV, into a strided output.
  DeviceBuffer d_w = Upload(h.w), d_grid = Upload(h.grid), d_bias = Upload(h.bias);
  Fp8DeviceWeight w = h.dev;
  w.data = d_w.as<uint8_t>();
  w.scales = d_grid.as<float>();
  const int64_t ldy = c.n + 8;
  DeviceBuffer d_y = Zeros(c.m * ldy * sizeof(Bf16));
  ASSERT_TRUE(Fp8GemvBf16(d_xq.as<uint8_t>(), d_xs.as<float>(), c.m, group, w, d_bias.as<float>(),
                          d_y.as<Bf16>(), ldy, nullptr)
                  .ok());
  const std::vector<float> got = FromBf16(Download<Bf16>(d_y, c.m * ldy));
  std::vector<float> want(c.m * c.n);
  kc::reference::Fp8Gemm(h.x.data(), c.m, h.cpu, h.act, h.bias.data(), want.data(), c.n);
  for (int64_t t = 0; t < c.m; ++t) {
    for (int64_t o = 0; o < c.n; o += (c.n > 1024 ? 7 : 1)) {
      double mag = 0;
      for (int64_t i = 0; i < c.k; ++i) {
        mag += std::abs(double{want_q[t * c.k + i]} * want_s[t * groups + i / group] *
                        kc::E4m3ToFloat(h.w[o * c.k + i]) *
                        h.per_row[o * h.dev.scale_cols() + i / h.dev.block]);
      }
      const float ref = want[t * c.n + o];
      EXPECT_NEAR(got[t * ldy + o], ref, 1e-5 * mag + std::abs(ref) / 256.0 + 1e-6)
          << "token " << t << " row " << o;
    }
    for (int64_t o = c.n; o < ldy; ++o) EXPECT_EQ(got[t * ldy + o], 0.f);  // untouched
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8GemvTest,
    ::testing::Values(Case{1, 200, 304, Scales::kBlock, 128, false},  // partial chunks
                      Case{3, 130, 640, Scales::kBlock, 128, false},
                      Case{8, 77, 1024, Scales::kBlock, 128, false},
                      Case{2, 96, 320, Scales::kChannel, 0, false},  // per-token
                      Case{4, 64, 256, Scales::kTensor, 0, true},    // static
                      Case{5, 50, 512, Scales::kChannel, 128, false},
                      Case{1, 4096, 4096, Scales::kBlock, 128, false},  // Llama-3-8B o_proj
                      Case{8, 1024, 4096, Scales::kBlock, 128, false}));

TEST(Fp8GemvValidation, RefusesWhatTheKernelCannotRun) {
  alignas(16) static uint8_t xq[4096];
  alignas(16) static uint8_t wbuf[4096];
  static float scales[64];
  Fp8DeviceWeight w{wbuf, 4, 300, scales, kFp8Block, kFp8Block};
  EXPECT_FALSE(Fp8GemvApplicable(1, 300, xq, w, 128));  // k % 16 != 0
  w.k = 256;
  EXPECT_TRUE(Fp8GemvApplicable(1, 256, xq, w, 128));
  EXPECT_FALSE(Fp8GemvApplicable(9, 256, xq, w, 128));      // too many tokens
  EXPECT_FALSE(Fp8GemvApplicable(1, 256, xq + 1, w, 128));  // misaligned
  EXPECT_FALSE(Fp8GemvApplicable(1, 256, xq, w, 64));       // group
  w.block = 64;
  EXPECT_FALSE(Fp8GemvApplicable(1, 256, xq, w, 128));  // block
  w.block = kFp8Block;
  Bf16 y[16];
  float xs[8];
  const absl::Status s = Fp8GemvBf16(xq, xs, 9, 128, w, nullptr, y, 4, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("1 <= m <= 8"), std::string::npos) << s;
  EXPECT_EQ(Fp8QuantizeActivations(nullptr, 1, 256, {}, xq, xs, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8QuantizeActivations(reinterpret_cast<const Bf16*>(wbuf), 1, 256, {64, nullptr}, xq,
                                   xs, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::kernels::cuda
