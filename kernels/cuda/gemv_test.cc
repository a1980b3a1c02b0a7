// Parity tests of the skinny bf16 GEMM (gemv.h) against the CPU reference
// GEMM: m = 1..8 on odd and Llama-3-8B shapes, with and without bias, bf16
// and fp32 output, through GemmContext (which routes m <= 8 here) and
// directly with forced k splits (the split-K path on small shapes). Also:
// results are bitwise repeatable, the tile counters are left at zero, a
// captured CUDA graph replays to the same bytes, shapes the kernel does not
// take are refused (direct call) or go to cuBLASLt (GemmContext). The
// staged kernel (SM 9.0+) against the same reference, in graphs, with and
// without the RoPE epilogue, and right after the RMSNorm that writes its x
// (it starts early and must still read the norm's output); its gate/up form
// with SiLU·mul in the epilogue against the staged GEMV followed by
// SiluMul.
// Skipped without a CUDA device.
//
// Tolerance as cuda_gemm_test: |y - ref| <= 1e-4 * sum_k |x w| (+ 2^-8 |ref|
// for bf16 output). Wide shapes are checked on a sample of columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/silu_mul.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::CaptureGraph;
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
  // Fewer: one wave of the 660 slots, in whole 512-value CTA iterations.
  EXPECT_EQ(GemvSplits(1, 2096, 4096, ws), 4);     // 131 tiles: 5 wanted, 26 steps -> 32: 4
  EXPECT_EQ(GemvSplits(1, 1024, 4096, ws), 8);     // 64 tiles, 128 steps: 8 x 16
  EXPECT_EQ(GemvSplits(1, 1024, 1024, ws), 2);     // 32 steps: whole iterations only
  EXPECT_EQ(GemvSplits(8, 16, 32, ws), 1);         // a single k step cannot split
  EXPECT_EQ(GemvSplits(1, 1024, 4096, ws, 3), 3);  // forced
  ws.partial_capacity = 4096;                      // one split's worth of m x n
  EXPECT_EQ(GemvSplits(1, 1024, 4096, ws), 4);
  ws.partial_capacity = 1024;
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
  const absl::Status captured = CaptureGraph(s, &graph, [&] { return RunContext(p, **ctx, s); });
  ASSERT_TRUE(captured.ok()) << captured;
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

// The qkv GEMV with RoPE and the KV-cache write in its epilogue, on
// RoPE-ordered weights, against the plain GEMV on the normal weights
// followed by the Rope kernel (with its KV write); and the Rope kernel on
// RoPE-ordered input (what steps of more than 8 tokens do after cuBLASLt)
// against the same. head_dim 16, 64 and 128, GQA, a bias, m in {1, 3, 8},
// unsplit and split, one row without a slot (no cache write). The
// projections are the same sums, so the outputs must agree to the bit in
// at least 99% of the values and within one bf16 step everywhere.
TEST(CudaGemvTest, QkvRopeEpilogueEqualsGemvThenRope) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  TestWorkspace tw;
  struct Shape {
    int d, heads, kv_heads;
  };
  for (const Shape sh : {Shape{16, 4, 2}, Shape{64, 8, 2}, Shape{128, 8, 4}}) {
    const int64_t d = sh.d, q_rows = sh.heads * d, k_rows = sh.kv_heads * d;
    const int64_t n = q_rows + 2 * k_rows, hidden = 256, num_slots = 32;
    const std::vector<Bf16> w = FastRandomBf16(n * hidden, 21 + d);
    const std::vector<float> bias = RandomFloats(n, 22, -0.5f, 0.5f);
    // RoPE-ordered copies of the weights and the bias.
    std::vector<Bf16> w_ord(w.size());
    std::vector<float> bias_ord(n);
    for (int64_t r = 0; r < n; ++r) {
      int64_t dst = r;
      if (r < q_rows + k_rows) dst = r / d * d + GemvRopeRow(r % d, d);
      std::copy_n(w.begin() + r * hidden, hidden, w_ord.begin() + dst * hidden);
      bias_ord[dst] = bias[r];
    }
    std::vector<float> inv_freq(d / 2);
    for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / d);
    DeviceBuffer d_w = Upload(w), d_w_ord = Upload(w_ord), d_b = Upload(bias),
                 d_b_ord = Upload(bias_ord), d_freq = Upload(inv_freq);
    for (const int64_t m : {1, 3, 8}) {
      // splits -1: the staged kernel (where the device has it), else the
      // tiled one unsplit (0) and split (2).
      for (const int splits : {-1, 0, 2}) {
        if (splits < 0 && (m != 1 || !GemvStagedSupported())) continue;
        SCOPED_TRACE(::testing::Message()
                     << "head_dim " << d << " m " << m << " forced splits " << splits);
        tw.ws.staged = splits < 0;
        DeviceBuffer x = Upload(FastRandomBf16(m * hidden, 30 + m));
        std::vector<int32_t> pos(m);
        std::vector<int64_t> slot(m);
        for (int64_t r = 0; r < m; ++r) {
          pos[r] = static_cast<int32_t>(100 + 37 * r);
          slot[r] = r == 1 ? -1 : 3 * r + 1;  // row 1 writes no K/V
        }
        DeviceBuffer d_pos = Upload(pos), d_slot = Upload(slot);
        const size_t cache_bytes = num_slots * k_rows * 2;
        // Reference: GEMV on the normal rows, then Rope with the KV write.
        DeviceBuffer ref_qkv = Zeros(m * n * 2), ref_k = Zeros(cache_bytes),
                     ref_v = Zeros(cache_bytes);
        ASSERT_TRUE(GemvBf16(x.as<Bf16>(), m, hidden, d_w.as<Bf16>(), n, d_b.as<float>(),
                             ref_qkv.as<Bf16>(), tw.ws, nullptr, std::max(splits, 0))
                        .ok());
        RopeKvWrite kv;
        kv.v = ref_qkv.as<Bf16>() + q_rows + k_rows;
        kv.v_token_stride = n;
        kv.slots = d_slot.as<int64_t>();
        kv.k_cache = ref_k.as<Bf16>();
        kv.v_cache = ref_v.as<Bf16>();
        kv.num_slots = num_slots;
        ASSERT_TRUE(Rope(ref_qkv.as<Bf16>(), n, sh.heads, ref_qkv.as<Bf16>() + q_rows, n,
                         sh.kv_heads, sh.d, d_pos.as<int32_t>(), m, d_freq.as<float>(), nullptr,
                         nullptr, 0.f, nullptr, &kv)
                        .ok());
        // Fused: the epilogue rotates and writes the caches.
        DeviceBuffer got_qkv = Zeros(m * n * 2), got_k = Zeros(cache_bytes),
                     got_v = Zeros(cache_bytes);
        GemvQkvRope rope;
        rope.head_dim = sh.d;
        rope.q_rows = q_rows;
        rope.k_rows = k_rows;
        rope.positions = d_pos.as<int32_t>();
        rope.inv_freq = d_freq.as<float>();
        rope.slots = d_slot.as<int64_t>();
        rope.num_slots = num_slots;
        rope.k_cache = got_k.as<Bf16>();
        rope.v_cache = got_v.as<Bf16>();
        ASSERT_TRUE(GemvQkvRopeBf16(x.as<Bf16>(), m, hidden, d_w_ord.as<Bf16>(),
                                    d_b_ord.as<float>(), got_qkv.as<Bf16>(), rope, tw.ws, nullptr,
                                    std::max(splits, 0))
                        .ok());
        // RoPE-ordered input to the Rope kernel (the path of longer steps).
        DeviceBuffer ord_qkv = Zeros(m * n * 2), ord_k = Zeros(cache_bytes),
                     ord_v = Zeros(cache_bytes);
        ASSERT_TRUE(GemvBf16(x.as<Bf16>(), m, hidden, d_w_ord.as<Bf16>(), n, d_b_ord.as<float>(),
                             ord_qkv.as<Bf16>(), tw.ws, nullptr, std::max(splits, 0))
                        .ok());
        kv.v = ord_qkv.as<Bf16>() + q_rows + k_rows;
        kv.k_cache = ord_k.as<Bf16>();
        kv.v_cache = ord_v.as<Bf16>();
        ASSERT_TRUE(Rope(ord_qkv.as<Bf16>(), n, sh.heads, ord_qkv.as<Bf16>() + q_rows, n,
                         sh.kv_heads, sh.d, d_pos.as<int32_t>(), m, d_freq.as<float>(), nullptr,
                         nullptr, 0.f, nullptr, &kv, /*rope_order=*/true)
                        .ok());
        ASSERT_TRUE(Synchronize(nullptr).ok());
        EXPECT_TRUE(tw.CountersZero());
        auto same = [](const DeviceBuffer& a, const DeviceBuffer& b, int64_t count,
                       const char* what) {
          const std::vector<float> x = FromBf16(Download<Bf16>(a, count));
          const std::vector<float> y = FromBf16(Download<Bf16>(b, count));
          int64_t exact = 0, off = 0;
          for (int64_t i = 0; i < count; ++i) {
            exact += x[i] == y[i];
            if (std::fabs(x[i] - y[i]) > 2 * kBf16Eps * std::fabs(y[i]) + 1e-6 && ++off <= 3) {
              ADD_FAILURE() << what << " element " << i << ": " << x[i] << " vs " << y[i];
            }
          }
          EXPECT_EQ(off, 0) << what;
          EXPECT_GE(exact, count * 99 / 100) << what << ": bitwise equal values";
        };
        same(got_qkv, ref_qkv, m * n, "fused qkv");
        same(got_k, ref_k, num_slots * k_rows, "fused k cache");
        same(got_v, ref_v, num_slots * k_rows, "fused v cache");
        same(ord_qkv, ref_qkv, m * n, "rope-ordered qkv");
        same(ord_k, ref_k, num_slots * k_rows, "rope-ordered k cache");
        // The row without a slot wrote nothing: its slot 4 stays zero.
        const std::vector<float> k_cache = FromBf16(Download<Bf16>(got_k, num_slots * k_rows));
        for (int64_t j = 0; j < k_rows; ++j) ASSERT_EQ(k_cache[4 * k_rows + j], 0.f);
      }
    }
  }
  tw.ws.staged = false;
  GemvQkvRope bad;
  bad.head_dim = 24;  // not a multiple of 16
  bad.q_rows = 48;
  bad.k_rows = 24;
  DeviceBuffer x = Upload(FastRandomBf16(64, 1)), w = Upload(FastRandomBf16(96 * 64, 2));
  DeviceBuffer y = Zeros(96 * 2);
  EXPECT_EQ(
      GemvQkvRopeBf16(x.as<Bf16>(), 1, 64, w.as<Bf16>(), nullptr, y.as<Bf16>(), bad, tw.ws, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// RoPE-ordered input to the Rope kernel is refused (before any launch, so
// no device is needed) with q/k norms, which need a head in its normal
// order, and with a head_dim that is not a multiple of 16.
TEST(CudaGemvTest, RopeOrderRefusesQkNormsAndUnpairedHeads) {
  alignas(16) static Bf16 qkv[4 * 128];
  static const int32_t pos[1] = {0};
  static const float freq[64] = {};
  static const float norm[128] = {};
  EXPECT_EQ(Rope(qkv, 256, 1, qkv + 128, 256, 1, 128, pos, 1, freq, norm, norm, 1e-6f, nullptr,
                 nullptr, /*rope_order=*/true)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rope(qkv, 48, 1, qkv + 24, 48, 1, 24, pos, 1, freq, nullptr, nullptr, 0.f, nullptr,
                 nullptr, /*rope_order=*/true)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The staged GEMV (SM 9.0+) against the reference: m = 1..8, with and
// without bias, from one 8-row tile to Llama-3-8B's qkv shard and a
// 4104-row weight; repeat and graph replay give the same bytes; shapes it
// does not take are refused and GemmContext::GemmChained sends them to
// Gemm().
TEST(CudaGemvTest, StagedMatchesReferenceAndRefusesWhatItCannotTake) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  if (!GemvStagedSupported()) GTEST_SKIP() << "the staged GEMV needs SM 9.0+";
  auto run = [](Problem& p, CudaStream s) {
    return GemvStagedBf16(p.d_x.as<Bf16>(), p.m, p.k, p.d_w.as<Bf16>(), p.n, p.bias_ptr(),
                          p.d_y.as<Bf16>(), s);
  };
  struct NK {
    int64_t n, k;
  };
  for (int64_t m = 1; m <= kGemvMaxRows; ++m) {
    for (const NK s : {NK{8, 128}, NK{24, 384}, NK{1000, 1024}, NK{4104, 2048}, NK{3072, 4096}}) {
      if (s.n * s.k > 4'000'000 && m % 4 != 1) continue;  // big shapes: m = 1, 5
      Problem p(m, s.n, s.k, /*bias=*/m % 2 == 0, /*f32=*/false);
      ASSERT_TRUE(run(p, nullptr).ok());
      CheckAgainstReference(p);
    }
  }
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaStream s = stream->get();
  Problem p(3, 2048, 4096, /*bias=*/true, /*f32=*/false);
  ASSERT_TRUE(run(p, s).ok());
  ASSERT_TRUE(Synchronize(s).ok());
  const std::vector<uint8_t> first = p.OutputBytes();
  CudaGraph graph;
  const absl::Status captured = CaptureGraph(s, &graph, [&] { return run(p, s); });
  ASSERT_TRUE(captured.ok()) << captured;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(MemsetDevice(p.d_y.data(), 0, p.d_y.size(), s).ok());
    ASSERT_TRUE(i == 0 ? run(p, s).ok() : graph.Launch(s).ok());
    ASSERT_TRUE(Synchronize(s).ok());
    EXPECT_EQ(p.OutputBytes(), first) << (i == 0 ? "direct call" : "replay");
  }
  // n % 8, k % 128, k above the limit, m above 8.
  Problem bad_n(1, 20, 128, false, false), bad_k(1, 16, 200, false, false),
      big_k(1, 8, kStagedMaxK + 128, false, false), bad_m(9, 16, 128, false, false);
  for (Problem* b : {&bad_n, &bad_k, &big_k, &bad_m}) {
    EXPECT_FALSE(GemvStagedApplicable(b->d_x.as<Bf16>(), b->m, b->n, b->k, b->d_w.as<Bf16>()));
    EXPECT_EQ(run(*b, nullptr).code(), absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  int per_sm = 0;
  ASSERT_TRUE(GemvStagedResidentCtasPerSm(1, 4096, &per_sm).ok());
  ASSERT_GE(per_sm, 1);
  const CudaQueryResult devices = QueryCudaDevices();
  ASSERT_FALSE(devices.info.devices.empty());
  const int64_t sms = devices.info.devices[0].sm_count;  // the test runs on device 0
  const int64_t one_wave = 8 * per_sm * sms;             // rows of n the staged grid holds at once
  EXPECT_TRUE((*ctx)->StagedTakes(1, one_wave, 4096));
  EXPECT_FALSE((*ctx)->StagedTakes(1, one_wave + 8, 4096));  // a second wave
  EXPECT_TRUE((*ctx)->StagedTakes(1, 14336, 4096));          // past the GEMV's size: else cuBLASLt
  EXPECT_FALSE((*ctx)->StagedTakes(2, 1024, 4096));
  EXPECT_FALSE((*ctx)->StagedTakes(1, 20, 128));
  for (Problem* b : {&bad_n, &bad_k, &big_k, &bad_m}) {
    ASSERT_TRUE((*ctx)
                    ->GemmChained(b->d_x.as<Bf16>(), b->m, b->k, b->d_w.as<Bf16>(), b->n, nullptr,
                                  b->d_y.as<Bf16>(), nullptr)
                    .ok());
    CheckAgainstReference(*b);
  }
  (*ctx)->SetUseStagedGemv(false);
  EXPECT_FALSE((*ctx)->StagedTakes(1, 1024, 4096));
}

// The staged GEMV launched right after the RMSNorm that writes its x (the
// norm lets it start early; it must still read the norm's output, not what
// x held before): eagerly and from a graph, with a different norm input
// each round, so a GEMV that read x too early would match the previous
// round instead.
TEST(CudaGemvTest, StagedAfterTheNormReadsTheNormsOutput) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  if (!GemvStagedSupported()) GTEST_SKIP() << "the staged GEMV needs SM 9.0+";
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaStream s = stream->get();
  const int64_t m = 2, k = 4096, n = 3072;
  Problem p(m, n, k, /*bias=*/false, /*f32=*/false);
  DeviceBuffer in = Zeros(m * k * sizeof(float));
  DeviceBuffer norm_w = Upload(std::vector<float>(k, 1.f));
  auto step = [&]() -> absl::Status {
    if (absl::Status st =
            RmsNorm(in.as<float>(), m, k, norm_w.as<float>(), 1e-5f, p.d_x.as<Bf16>(), s);
        !st.ok()) {
      return st;
    }
    return GemvStagedBf16(p.d_x.as<Bf16>(), m, k, p.d_w.as<Bf16>(), n, nullptr, p.d_y.as<Bf16>(),
                          s);
  };
  CudaGraph graph;
  const absl::Status captured = CaptureGraph(s, &graph, [&] { return step(); });
  ASSERT_TRUE(captured.ok()) << captured;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const std::vector<float> v = RandomFloats(m * k, 40 + round, -3.f, 3.f);
    ASSERT_TRUE(CopyToDevice(in.data(), v.data(), v.size() * sizeof(float), s).ok());
    ASSERT_TRUE(round % 2 == 0 ? step().ok() : graph.Launch(s).ok());
    ASSERT_TRUE(Synchronize(s).ok());
    p.x = Download<Bf16>(p.d_x, m * k);
    CheckAgainstReference(p);
  }
}

// The staged gate/up GEMV with SiLU·mul in its epilogue against the same
// kernel without it (GemvStagedBf16 on the same weights: the same sums in
// the same order) followed by SiluMul on the gate/up GEMV order: bitwise
// the same. (Against the tiled GEMV on the normal rows the projections are
// summed in another order, and where a projection cancels to near zero the
// difference after SiLU·mul is not bounded by a few bf16 steps of the
// result; StagedMatchesReferenceAndRefusesWhatItCannotTake and cuda_ops_test's SiluMul cover the
// two halves.) m 1 and 3, with and without bias, up to a TP=2 rank's
// Llama-3-8B shard; an intermediate size that is not a multiple of 4 is
// refused.
TEST(CudaGemvTest, StagedGateUpSiluEqualsStagedGemvThenSiluMul) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  if (!GemvStagedSupported()) GTEST_SKIP() << "the staged GEMV needs SM 9.0+";
  struct Shape {
    int64_t inter, hidden;
  };
  for (const Shape sh : {Shape{4, 128}, Shape{100, 256}, Shape{7168, 4096}}) {
    const int64_t n = 2 * sh.inter;
    DeviceBuffer w = Upload(FastRandomBf16(n * sh.hidden, 51 + sh.inter));
    DeviceBuffer b = Upload(RandomFloats(n, 52, -0.5f, 0.5f));
    for (const int64_t m : {1, 3}) {
      for (const bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "inter " << sh.inter << " m " << m << " bias " << with_bias);
        DeviceBuffer x = Upload(FastRandomBf16(m * sh.hidden, 60 + m));
        DeviceBuffer gate_up = Zeros(m * n * 2), want = Zeros(m * sh.inter * 2),
                     got = Zeros(m * sh.inter * 2);
        const float* bias = with_bias ? b.as<float>() : nullptr;
        ASSERT_TRUE(GemvStagedBf16(x.as<Bf16>(), m, sh.hidden, w.as<Bf16>(), n, bias,
                                   gate_up.as<Bf16>(), nullptr)
                        .ok());
        ASSERT_TRUE(SiluMul(gate_up.as<Bf16>(), m, sh.inter, want.as<Bf16>(), nullptr,
                            /*interleaved=*/true)
                        .ok());
        ASSERT_TRUE(GemvStagedGateUpSiluBf16(x.as<Bf16>(), m, sh.hidden, w.as<Bf16>(), sh.inter,
                                             bias, got.as<Bf16>(), nullptr)
                        .ok());
        ASSERT_TRUE(Synchronize(nullptr).ok());
        EXPECT_EQ(Download<Bf16>(got, m * sh.inter), Download<Bf16>(want, m * sh.inter));
      }
    }
  }
  DeviceBuffer x = Upload(FastRandomBf16(128, 1)), w = Upload(FastRandomBf16(12 * 128, 2));
  DeviceBuffer act = Zeros(6 * 2);
  EXPECT_EQ(GemvStagedGateUpSiluBf16(x.as<Bf16>(), 1, 128, w.as<Bf16>(), 6, nullptr, act.as<Bf16>(),
                                     nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// What the staged kernels refuse, before any launch (so no device is
// needed): more than 8 rows, n not a multiple of 8, k not a multiple of 128
// or above kStagedMaxK, a misaligned x, an intermediate size that is not a
// multiple of 4; SiluMul on the interleaved order with such a size.
TEST(CudaGemvTest, StagedRefusesBadShapesOnTheHost) {
  alignas(16) static Bf16 x[8 * 256];
  alignas(16) static Bf16 w[64 * 256];
  alignas(16) static Bf16 y[8 * 64];
  EXPECT_TRUE(GemvStagedApplicable(x, 1, 64, 256, w));
  EXPECT_FALSE(GemvStagedApplicable(x, 9, 64, 256, w));
  EXPECT_FALSE(GemvStagedApplicable(x, 0, 64, 256, w));
  EXPECT_FALSE(GemvStagedApplicable(x, 1, 60, 256, w));
  EXPECT_FALSE(GemvStagedApplicable(x, 1, 64, 200, w));
  EXPECT_FALSE(GemvStagedApplicable(x, 1, 64, kStagedMaxK + 128, w));
  EXPECT_FALSE(GemvStagedApplicable(x + 1, 1, 64, 256, w));
  EXPECT_EQ(GemvStagedBf16(x, 9, 256, w, 64, nullptr, y, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemvStagedBf16(x, 1, 256, w, 60, nullptr, y, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemvStagedBf16(x, 1, 256, w, 64, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemvStagedGateUpSiluBf16(x, 1, 256, w, 30, nullptr, y, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  int ctas = -1;
  EXPECT_EQ(GemvStagedResidentCtasPerSm(9, 256, &ctas).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctas, 0);
  EXPECT_EQ(SiluMul(w, 2, 30, y, nullptr, /*interleaved=*/true).code(),
            absl::StatusCode::kInvalidArgument);
  // The gate/up order: gate j at 8 (j / 4) + j % 4, up j four rows later.
  EXPECT_EQ(GemvGateUpRow(0, 8), 0);
  EXPECT_EQ(GemvGateUpRow(5, 8), 9);
  EXPECT_EQ(GemvGateUpRow(8, 8), 4);
  EXPECT_EQ(GemvGateUpRow(13, 8), 13);
  EXPECT_EQ(GemvRopeRow(5, 16), 9);
  EXPECT_EQ(GemvRopeRow(8 + 5, 16), 13);
}

// Without a CUDA device (CI) the staged kernels are unsupported and a
// well-formed call is a FAILED_PRECONDITION, not an internal error or a
// launch (on a GPU machine this test has nothing to check).
TEST(CudaGemvTest, StagedWithoutADeviceIsAPreconditionError) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  alignas(16) static Bf16 x[256];
  alignas(16) static Bf16 w[64 * 256];
  alignas(16) static Bf16 y[64];
  EXPECT_FALSE(GemvStagedSupported());
  EXPECT_EQ(GemvStagedBf16(x, 1, 256, w, 64, nullptr, y, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GemvStagedGateUpSiluBf16(x, 1, 256, w, 32, nullptr, y, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  int ctas = -1;
  EXPECT_EQ(GemvStagedResidentCtasPerSm(1, 256, &ctas).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ctas, 0);
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
