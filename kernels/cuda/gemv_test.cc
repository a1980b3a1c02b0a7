// Parity tests of the skinny bf16 GEMM (gemv.h) against the CPU reference
// GEMM: m = 1..8 on odd and Llama-3-8B shapes, with and without bias, bf16
// and fp32 output, through GemmContext (which routes m <= 8 here) and
// directly with forced k splits (the split-K path on small shapes). Also:
// results are bitwise repeatable, the tile counters are left at zero, a
// captured CUDA graph replays to the same bytes, shapes the kernel does not
// take are refused (direct call) or go to cuBLASLt (GemmContext). Skipped
// without a CUDA device.
//
// Tolerance as cuda_gemm_test: |y - ref| <= 1e-4 * sum_k |x w| (+ 2^-8 |ref|
// for bf16 output). Wide shapes are checked on a sample of columns.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/silu_mul.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::FastRandomBf16;
using cuda_testing::FromBf16;
using cuda_testing::kBf16Eps;
using cuda_testing::RandomFloats;
using cuda_testing::Upload;
using cuda_testing::Zeros;
namespace ref = ::tessera::kernels::cpu::reference;

// Device-side GEMV workspace for direct calls.
struct TestWorkspace {
  DeviceBuffer partials, counters;
  GemvWorkspace ws;
  TestWorkspace() {
    partials = Zeros(kGemvPartialFloats * sizeof(float));
    counters = Zeros(kGemvCounters * sizeof(uint32_t));
    ws.partials = partials.as<float>();
    ws.partial_capacity = kGemvPartialFloats;
    ws.counters = counters.as<uint32_t>();
    ws.counter_capacity = kGemvCounters;
    ws.num_sms = 132;
    ws.ctas_per_sm = 4;
  }
  bool CountersZero() {
    const std::vector<uint32_t> c = Download<uint32_t>(counters, kGemvCounters);
    for (uint32_t v : c) {
      if (v != 0) return false;
    }
    return true;
  }
};

struct Problem {
  int64_t m, n, k;
  bool bias, f32_out;
  std::vector<Bf16> x, w;
  std::vector<float> b;
  DeviceBuffer d_x, d_w, d_b, d_y;
  Problem(int64_t m_, int64_t n_, int64_t k_, bool bias_, bool f32_)
      : m(m_), n(n_), k(k_), bias(bias_), f32_out(f32_) {
    x = FastRandomBf16(m * k, 11 + m * 7 + k);
    w = FastRandomBf16(n * k, 13 + n);
    b = RandomFloats(n, 17, -2.f, 2.f);
    d_x = Upload(x);
    d_w = Upload(w);
    d_b = Upload(b);
    d_y = Zeros(m * n * (f32_out ? 4 : 2));
  }
  const float* bias_ptr() const { return bias ? d_b.as<float>() : nullptr; }
  std::vector<uint8_t> OutputBytes() const {
    return Download<uint8_t>(d_y, m * n * (f32_out ? 4 : 2));
  }
};

absl::Status RunGemv(Problem& p, const GemvWorkspace& ws, int force_splits, CudaStream s) {
  return p.f32_out ? GemvBf16(p.d_x.as<Bf16>(), p.m, p.k, p.d_w.as<Bf16>(), p.n, p.bias_ptr(),
                              p.d_y.as<float>(), ws, s, force_splits)
                   : GemvBf16(p.d_x.as<Bf16>(), p.m, p.k, p.d_w.as<Bf16>(), p.n, p.bias_ptr(),
                              p.d_y.as<Bf16>(), ws, s, force_splits);
}

absl::Status RunContext(Problem& p, GemmContext& ctx, CudaStream s) {
  return p.f32_out ? ctx.Gemm(p.d_x.as<Bf16>(), p.m, p.k, p.d_w.as<Bf16>(), p.n, p.bias_ptr(),
                              p.d_y.as<float>(), s)
                   : ctx.Gemm(p.d_x.as<Bf16>(), p.m, p.k, p.d_w.as<Bf16>(), p.n, p.bias_ptr(),
                              p.d_y.as<Bf16>(), s);
}

// Compares p's device output with the reference on (sampled) columns.
void CheckAgainstReference(const Problem& p) {
  SCOPED_TRACE(::testing::Message() << "m " << p.m << " n " << p.n << " k " << p.k << " bias "
                                    << p.bias << " f32 " << p.f32_out);
  std::vector<float> y;
  if (p.f32_out) {
    y = Download<float>(p.d_y, p.m * p.n);
  } else {
    y = FromBf16(Download<Bf16>(p.d_y, p.m * p.n));
  }
  std::vector<int64_t> cols;
  if (p.n <= 600) {
    for (int64_t j = 0; j < p.n; ++j) cols.push_back(j);
  } else {
    std::mt19937 rng(5);
    for (int i = 0; i < 80; ++i) cols.push_back(rng() % p.n);
    for (int64_t j = 0; j < 20; ++j) cols.push_back(j);  // first tiles
    cols.push_back(p.n - 1);
  }
  std::vector<Bf16> w_sub(cols.size() * p.k);
  std::vector<float> b_sub(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    for (int64_t i = 0; i < p.k; ++i) w_sub[c * p.k + i] = p.w[cols[c] * p.k + i];
    b_sub[c] = p.b[cols[c]];
  }
  const std::vector<float> xf = FromBf16(p.x);
  const std::vector<float> wf = FromBf16(w_sub);
  std::vector<float> want(p.m * cols.size());
  cpu::WeightMatrix wm{w_sub.data(), cpu::DType::kBF16, static_cast<int64_t>(cols.size()), p.k};
  ref::Gemm(xf.data(), p.m, wm, p.bias ? b_sub.data() : nullptr, want.data());
  for (int64_t r = 0; r < p.m; ++r) {
    for (size_t c = 0; c < cols.size(); ++c) {
      double mag = 0;
      for (int64_t i = 0; i < p.k; ++i) mag += std::fabs(double{xf[r * p.k + i]} * wf[c * p.k + i]);
      const double want_v = want[r * cols.size() + c];
      const double tol = 1e-4 * mag + (p.f32_out ? 1e-6 : kBf16Eps * std::fabs(want_v) + 1e-6);
      ASSERT_NEAR(y[r * p.n + cols[c]], want_v, tol) << "row " << r << " col " << cols[c];
    }
  }
}

TEST(CudaGemvTest, ContextRoutesSkinnyShapesAndMatchesReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  struct NK {
    int64_t n, k;
  };
  const NK odd[] = {{1, 8}, {17, 24}, {97, 200}, {1001, 136}, {513, 1032}, {4099, 520}};
  for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
    for (const NK& s : odd) {
      for (int variant = 0; variant < 3; ++variant) {
        Problem p(m, s.n, s.k, /*bias=*/variant >= 1, /*f32=*/variant == 2);
        ASSERT_TRUE(RunContext(p, **ctx, nullptr).ok());
        CheckAgainstReference(p);
      }
    }
  }
  // Decode shapes of Llama-3-8B (o_proj, qkv, down) and an fp32 lm_head.
  const NK big[] = {{4096, 4096}, {6144, 4096}, {4096, 14336}};
  for (int64_t m : {1, 3, 8}) {
    for (const NK& s : big) {
      Problem p(m, s.n, s.k, /*bias=*/m == 3, /*f32=*/false);
      ASSERT_TRUE(RunContext(p, **ctx, nullptr).ok());
      CheckAgainstReference(p);
    }
  }
  Problem logits(2, 32000, 4096, false, true);
  ASSERT_TRUE(RunContext(logits, **ctx, nullptr).ok());
  CheckAgainstReference(logits);
}

TEST(CudaGemvTest, ForcedSplitsMatchReferenceAndLeaveCountersZero) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  TestWorkspace tw;
  for (int64_t m : {1, 2, 5, 8}) {
    for (int splits : {2, 3, 7}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{97, 1000}, {33, 2056}, {300, 264}}) {
        Problem p(m, n, k, /*bias=*/splits != 2, /*f32=*/splits == 7);
        EXPECT_GT(GemvSplits(m, n, k, tw.ws, splits), 1);
        ASSERT_TRUE(RunGemv(p, tw.ws, splits, nullptr).ok());
        CheckAgainstReference(p);
      }
    }
  }
  EXPECT_TRUE(tw.CountersZero());
}

TEST(CudaGemvTest, SplitPlanFillsTheGpuAndRespectsTheWorkspace) {
  GemvWorkspace ws;
  ws.num_sms = 132;
  // Without a workspace there is never a split.
  EXPECT_EQ(GemvSplits(1, 4096, 4096, ws), 1);
  std::vector<float> fake_partials(1);
  std::vector<uint32_t> fake_counters(1);
  ws.partials = fake_partials.data();  // only the pointers' presence matters here
  ws.counters = fake_counters.data();
  ws.partial_capacity = kGemvPartialFloats;
  ws.counter_capacity = kGemvCounters;
  ws.ctas_per_sm = 5;  // 660 slots
  // At least one row tile per SM: unsplit.
  EXPECT_EQ(GemvSplits(1, 4096, 4096, ws), 1);  // 256 tiles
  EXPECT_EQ(GemvSplits(1, 6144, 4096, ws), 1);
  EXPECT_EQ(GemvSplits(1, 4096, 14336, ws), 1);
  EXPECT_EQ(GemvSplits(1, 28672, 4096, ws), 1);
  EXPECT_EQ(GemvSplits(1, 128256, 4096, ws), 1);
  EXPECT_EQ(GemvSplits(1, 2112, 4096, ws), 1);  // 132 tiles
  // Fewer: one wave of the 660 slots.
  EXPECT_EQ(GemvSplits(1, 2096, 4096, ws), 4);  // 131 tiles: 5 wanted, 26 steps each -> 32: 4
  EXPECT_EQ(GemvSplits(1, 1024, 4096, ws), 8);  // 64 tiles, 128 steps: 8 x 16
  EXPECT_EQ(GemvSplits(1, 1024, 1024, ws), 2);  // 32 steps: whole iterations only
  EXPECT_EQ(GemvSplits(8, 16, 32, ws), 1);      // a single k step cannot split
  ws.partial_capacity = 1024;                   // one split's worth of m x 64 tiles x 16
  EXPECT_EQ(GemvSplits(1, 1024, 4096, ws), 1);
}

TEST(CudaGemvTest, RepeatableAndGraphReplayGivesTheSameBytes) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaStream s = stream->get();
  Problem p(1, 1024, 4096, /*bias=*/true, /*f32=*/false);  // split-K: 64 tiles < 132 SMs
  ASSERT_TRUE(RunContext(p, **ctx, s).ok());
  ASSERT_TRUE(Synchronize(s).ok());
  const std::vector<uint8_t> first = p.OutputBytes();
  CheckAgainstReference(p);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(MemsetDevice(p.d_y.data(), 0, p.d_y.size(), s).ok());
    ASSERT_TRUE(RunContext(p, **ctx, s).ok());
    ASSERT_TRUE(Synchronize(s).ok());
    EXPECT_EQ(p.OutputBytes(), first) << "direct call " << i;
  }
  CudaGraph graph;
  ASSERT_TRUE(graph.BeginCapture(s).ok());
  const absl::Status captured = RunContext(p, **ctx, s);
  const absl::Status ended = graph.EndCapture();
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_TRUE(ended.ok()) << ended;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(MemsetDevice(p.d_y.data(), 0, p.d_y.size(), s).ok());
    ASSERT_TRUE(graph.Launch(s).ok());
    ASSERT_TRUE(Synchronize(s).ok());
    EXPECT_EQ(p.OutputBytes(), first) << "replay " << i;
  }
  // The cuBLASLt path agrees within tolerance.
  (*ctx)->SetUseGemv(false);
  ASSERT_TRUE(RunContext(p, **ctx, s).ok());
  ASSERT_TRUE(Synchronize(s).ok());
  CheckAgainstReference(p);
}

// Fused decode layer boundary (GemvFusion) against the unfused kernels on
// the device: o-projection GEMV + FusedAddRmsNorm, then the gate/up GEMV +
// SiluMul, and the next layer's qkv GEMV after an RMSNorm, for m in
// {1, 3, 8} rows and unsplit / forced-split GEMVs. The residual update
// must be bitwise the unfused one (same dot products, same bf16 delta, same
// add); the normalized inputs differ only in the order the sum of squares
// is taken, so the GEMV outputs after a norm agree within 2 bf16 steps.
TEST(CudaGemvTest, FusedNormSiluAndResidualMatchTheUnfusedKernels) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  TestWorkspace tw;
  constexpr int64_t kH = 1024, kI = 1536, kQkv = 1536;
  constexpr float kEps = 1e-5f;
  const std::vector<Bf16> w_o = FastRandomBf16(kH * kH, 3);
  const std::vector<Bf16> w_gu = FastRandomBf16(2 * kI * kH, 4);
  const std::vector<Bf16> w_qkv = FastRandomBf16(kQkv * kH, 5);
  const std::vector<float> norm_w = RandomFloats(kH, 6, 0.5f, 1.5f);
  const std::vector<float> gu_bias = RandomFloats(2 * kI, 7, -0.5f, 0.5f);
  DeviceBuffer d_w_o = Upload(w_o), d_w_gu = Upload(w_gu), d_w_qkv = Upload(w_qkv);
  DeviceBuffer d_norm = Upload(norm_w), d_gu_bias = Upload(gu_bias);
  for (const int64_t m : {1, 3, 8}) {
    for (const int splits : {0, 3}) {
      SCOPED_TRACE(::testing::Message() << "m " << m << " forced splits " << splits);
      const std::vector<Bf16> attn = FastRandomBf16(m * kH, 8 + m);
      const std::vector<float> residual0 = RandomFloats(m * kH, 9 + m, -2.f, 2.f);
      DeviceBuffer d_attn = Upload(attn);
      // Unfused: delta = attn . Wo^T; residual += delta; xb = norm(residual);
      // act = silu_mul(xb . Wgu^T + b); xb2 = norm(residual); qkv = xb2 . Wqkv^T.
      DeviceBuffer u_res = Upload(residual0), u_delta = Zeros(m * kH * 2), u_xb = Zeros(m * kH * 2);
      DeviceBuffer u_gu = Zeros(m * 2 * kI * 2), u_act = Zeros(m * kI * 2);
      DeviceBuffer u_qkv = Zeros(m * kQkv * 2);
      ASSERT_TRUE(GemvBf16(d_attn.as<Bf16>(), m, kH, d_w_o.as<Bf16>(), kH, nullptr,
                           u_delta.as<Bf16>(), tw.ws, nullptr, splits)
                      .ok());
      ASSERT_TRUE(FusedAddRmsNorm(u_delta.as<Bf16>(), u_res.as<float>(), m, kH, d_norm.as<float>(),
                                  kEps, u_xb.as<Bf16>(), nullptr)
                      .ok());
      ASSERT_TRUE(GemvBf16(u_xb.as<Bf16>(), m, kH, d_w_gu.as<Bf16>(), 2 * kI, d_gu_bias.as<float>(),
                           u_gu.as<Bf16>(), tw.ws, nullptr, splits)
                      .ok());
      ASSERT_TRUE(SiluMul(u_gu.as<Bf16>(), m, kI, u_act.as<Bf16>(), nullptr).ok());
      ASSERT_TRUE(GemvBf16(u_xb.as<Bf16>(), m, kH, d_w_qkv.as<Bf16>(), kQkv, nullptr,
                           u_qkv.as<Bf16>(), tw.ws, nullptr, splits)
                      .ok());
      // Fused: the o GEMV adds into the residual and leaves the partial sums
      // of squares; the gate/up and qkv GEMVs normalize on load.
      DeviceBuffer f_res = Upload(residual0), f_act = Zeros(m * kI * 2);
      DeviceBuffer f_qkv = Zeros(m * kQkv * 2);
      const int parts = GemvNormParts(kH);
      DeviceBuffer sumsq = Zeros(m * parts * sizeof(float));
      GemvFusion add;
      add.epilogue = GemvFusion::Epilogue::kAddResidual;
      add.residual = f_res.as<float>();
      add.sumsq_out = sumsq.as<float>();
      ASSERT_TRUE(GemvBf16Fused(d_attn.as<Bf16>(), m, kH, d_w_o.as<Bf16>(), kH, nullptr, nullptr,
                                add, tw.ws, nullptr, splits)
                      .ok());
      GemvFusion norm;
      norm.norm_residual = f_res.as<float>();
      norm.norm_weight = d_norm.as<float>();
      norm.norm_sumsq = sumsq.as<float>();
      norm.norm_parts = parts;
      norm.eps = kEps;
      GemvFusion silu = norm;
      silu.epilogue = GemvFusion::Epilogue::kSiluMul;
      ASSERT_TRUE(GemvBf16Fused(nullptr, m, kH, d_w_gu.as<Bf16>(), 2 * kI, d_gu_bias.as<float>(),
                                f_act.as<Bf16>(), silu, tw.ws, nullptr, splits)
                      .ok());
      ASSERT_TRUE(GemvBf16Fused(nullptr, m, kH, d_w_qkv.as<Bf16>(), kQkv, nullptr, f_qkv.as<Bf16>(),
                                norm, tw.ws, nullptr, splits)
                      .ok());
      ASSERT_TRUE(Synchronize(nullptr).ok());
      EXPECT_TRUE(tw.CountersZero());

      const std::vector<float> ur = Download<float>(u_res, m * kH);
      const std::vector<float> fr = Download<float>(f_res, m * kH);
      ASSERT_EQ(ur, fr) << "the residual update differs";
      const std::vector<float> ss = Download<float>(sumsq, m * parts);
      for (int64_t r = 0; r < m; ++r) {
        for (int t = 0; t < parts; ++t) {
          double want = 0;
          for (int j = 0; j < 16; ++j)
            want += double{fr[r * kH + t * 16 + j]} * fr[r * kH + t * 16 + j];
          ASSERT_NEAR(ss[r * parts + t], want, 1e-5 * want + 1e-6) << "row " << r << " tile " << t;
        }
      }
      auto close = [](const std::vector<float>& got, const std::vector<float>& want,
                      const char* what) {
        double scale = 0;
        for (float v : want) scale = std::max(scale, double{std::fabs(v)});
        int off = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double tol = 2 * kBf16Eps * std::fabs(want[i]) + 1e-3 * scale;
          if (std::fabs(got[i] - want[i]) > tol && ++off <= 5) {
            ADD_FAILURE() << what << " element " << i << ": fused " << got[i] << " unfused "
                          << want[i];
          }
        }
        return off;
      };
      EXPECT_EQ(close(FromBf16(Download<Bf16>(f_act, m * kI)),
                      FromBf16(Download<Bf16>(u_act, m * kI)), "silu(gate) * up"),
                0);
      EXPECT_EQ(close(FromBf16(Download<Bf16>(f_qkv, m * kQkv)),
                      FromBf16(Download<Bf16>(u_qkv, m * kQkv)), "qkv after the norm"),
                0);
    }
  }
}

TEST(CudaGemvTest, FusionRefusesUnusableStages) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  TestWorkspace tw;
  Problem p(2, 64, 64, false, false);
  DeviceBuffer res = Zeros(2 * 64 * sizeof(float)), nw = Zeros(64 * sizeof(float));
  DeviceBuffer ss = Zeros(2 * 4 * sizeof(float));
  auto run = [&](const GemvFusion& f, int64_t n) {
    return GemvBf16Fused(p.d_x.as<Bf16>(), 2, 64, p.d_w.as<Bf16>(), n, nullptr, p.d_y.as<Bf16>(), f,
                         tw.ws, nullptr)
        .code();
  };
  GemvFusion add;
  add.epilogue = GemvFusion::Epilogue::kAddResidual;
  EXPECT_EQ(run(add, 64), absl::StatusCode::kInvalidArgument);  // no residual
  add.residual = res.as<float>();
  add.sumsq_out = ss.as<float>();
  EXPECT_EQ(run(add, 64), absl::StatusCode::kOk);
  add.norm_residual = res.as<float>();  // reading what it writes
  add.norm_weight = nw.as<float>();
  add.norm_sumsq = ss.as<float>();
  add.norm_parts = 4;
  EXPECT_EQ(run(add, 64), absl::StatusCode::kInvalidArgument);
  GemvFusion silu;
  silu.epilogue = GemvFusion::Epilogue::kSiluMul;
  EXPECT_EQ(run(silu, 63), absl::StatusCode::kInvalidArgument);  // odd gate/up rows
  EXPECT_EQ(run(silu, 64), absl::StatusCode::kOk);
  GemvFusion norm;
  norm.norm_residual = res.as<float>();
  norm.norm_weight = nw.as<float>();
  EXPECT_EQ(run(norm, 64), absl::StatusCode::kInvalidArgument);  // no partial sums
  ASSERT_TRUE(Synchronize(nullptr).ok());
}

TEST(CudaGemvTest, RefusesWhatItCannotTakeAndContextFallsBack) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  TestWorkspace tw;
  Problem p(9, 64, 64, false, false);
  EXPECT_FALSE(GemvApplicable(p.d_x.as<Bf16>(), 9, 64, p.d_w.as<Bf16>()));
  EXPECT_EQ(RunGemv(p, tw.ws, 0, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // k % 8 != 0 and a misaligned x row pointer.
  Problem q(2, 64, 60, false, false);
  EXPECT_EQ(RunGemv(q, tw.ws, 0, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(GemvApplicable(q.d_x.as<Bf16>() + 1, 1, 64, q.d_w.as<Bf16>()));
  EXPECT_EQ(GemvBf16(q.d_x.as<Bf16>(), 2, 56, q.d_w.as<Bf16>(), 64, nullptr,
                     static_cast<Bf16*>(nullptr), tw.ws, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // GemmContext sends those shapes to cuBLASLt and still matches.
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ASSERT_TRUE(RunContext(p, **ctx, nullptr).ok());
  CheckAgainstReference(p);
  Problem r(3, 77, 60, true, false);
  ASSERT_TRUE(RunContext(r, **ctx, nullptr).ok());
  CheckAgainstReference(r);
}

}  // namespace
}  // namespace tessera::kernels::cuda
