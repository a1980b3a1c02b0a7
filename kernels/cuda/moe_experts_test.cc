// The CUDA MoE expert kernels: grouping by expert against a host counting
// sort, and the whole expert block (grouping, GEMV or grouped GEMM,
// combine; the grouped GEMM with both its kernels, mma.sync and, on SM 9.0,
// wgmma) against a straightforward host computation, on the edge cases
// of issue #33: one token, more tokens than experts, every token to one
// expert (several GEMM tiles), experts with no token (their weights are
// NaN, so reading them would show), expert parallelism, shared experts,
// and a replay of a captured CUDA graph with new routing. Validation cases
// run on the host.
//
// The host reference rounds where the kernels do (gate and up to bf16
// before the SiLU, act and the expert outputs to bf16, the output once)
// and sums in double; the kernels sum in fp32 in another order, so a
// rounding may land one bf16 ulp apart: outputs are compared to 1e-2
// absolute + 2e-2 relative, far below what a wrong row, column or expert
// gives (O(1)).
#include "kernels/cuda/moe_experts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {
namespace {

using ::testing::HasSubstr;
using namespace cuda_testing;  // NOLINT

float RoundBf16(float v) { return Bf16ToFloat(FloatToBf16(v)); }

struct Problem {
  int64_t tokens = 0, hidden = 0, inter = 0;
  int experts = 0;  // held here
  int top_k = 0;
  int32_t first_expert = 0;
  std::vector<float> x;        // [T, H]
  std::vector<float> gate_up;  // [E, 2I, H]
  std::vector<float> down;     // [E, H, I]
  std::vector<int32_t> ids;    // [T, k] global
  std::vector<float> weights;  // [T, k]
  std::vector<float> shared;   // [T, H] or empty
};

// Random bf16-exact data; every token chooses top_k distinct experts of
// [0, global_experts).
Problem RandomProblem(int64_t tokens, int64_t hidden, int64_t inter, int experts, int top_k,
                      int global_experts, uint32_t seed) {
  Problem p;
  p.tokens = tokens;
  p.hidden = hidden;
  p.inter = inter;
  p.experts = experts;
  p.top_k = top_k;
  p.x = RandomBf16Floats(tokens * hidden, seed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  p.gate_up = RandomBf16Floats(experts * 2 * inter * hidden, seed + 1, -2 * scale, 2 * scale);
  p.down = RandomBf16Floats(experts * hidden * inter, seed + 2, -2 * scale, 2 * scale);
  std::mt19937 rng(seed + 3);
  std::vector<int32_t> all(global_experts);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    p.ids.insert(p.ids.end(), all.begin(), all.begin() + top_k);
  }
  p.weights = RandomFloats(tokens * top_k, seed + 4, 0.05f, 1.0f);
  return p;
}

// The expert MLP of one token and one local expert, rounded as the kernels round.
std::vector<float> ExpertOutput(const Problem& p, int64_t t, int e) {
  const int64_t H = p.hidden, I = p.inter;
  const float* x = &p.x[t * H];
  std::vector<float> act(I), y(H);
  for (int64_t n = 0; n < I; ++n) {
    const float* g = &p.gate_up[(e * 2 * I + n) * H];
    const float* u = g + I * H;
    double gs = 0, us = 0;
    for (int64_t h = 0; h < H; ++h) {
      gs += double{x[h]} * g[h];
      us += double{x[h]} * u[h];
    }
    const float gr = RoundBf16(static_cast<float>(gs)), ur = RoundBf16(static_cast<float>(us));
    act[n] = RoundBf16(gr / (1.0f + std::exp(-gr)) * ur);
  }
  for (int64_t h = 0; h < H; ++h) {
    const float* d = &p.down[(e * H + h) * I];
    double s = 0;
    for (int64_t n = 0; n < I; ++n) s += double{act[n]} * d[n];
    y[h] = RoundBf16(static_cast<float>(s));
  }
  return y;
}

std::vector<float> Reference(const Problem& p) {
  std::vector<float> out(p.tokens * p.hidden);
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::vector<double> acc(p.hidden, 0.0);
    for (int j = 0; j < p.top_k; ++j) {
      const int e = p.ids[t * p.top_k + j] - p.first_expert;
      if (e < 0 || e >= p.experts) continue;
      const std::vector<float> y = ExpertOutput(p, t, e);
      for (int64_t h = 0; h < p.hidden; ++h) acc[h] += double{p.weights[t * p.top_k + j]} * y[h];
    }
    for (int64_t h = 0; h < p.hidden; ++h) {
      const double s = p.shared.empty() ? 0.0 : p.shared[t * p.hidden + h];
      out[t * p.hidden + h] = RoundBf16(static_cast<float>(acc[h] + s));
    }
  }
  return out;
}

// A way to run the expert block: a path and, for the grouped GEMM, its kernel.
struct Variant {
  MoeExpertsPath path;
  MoeGemmKernelKind kernel;
  const char* name;
};

// The problem's buffers on the device and one MoeExperts call over them.
struct DeviceProblem {
  DeviceBuffer x, gate_up, down, ids, weights, shared, out, workspace;
  MoeExpertsArgs args;

  DeviceProblem(const Problem& p, Variant variant, int64_t max_tokens) {
    x = Upload(ToBf16(p.x));
    gate_up = Upload(ToBf16(p.gate_up));
    down = Upload(ToBf16(p.down));
    ids = Upload(p.ids);
    weights = Upload(p.weights);
    if (!p.shared.empty()) shared = Upload(ToBf16(p.shared));
    out = Zeros(sizeof(Bf16) * p.tokens * p.hidden);
    args.x = x.as<Bf16>();
    args.num_tokens = p.tokens;
    args.ids = ids.as<int32_t>();
    args.weights = weights.as<float>();
    args.top_k = p.top_k;
    args.first_expert = p.first_expert;
    args.experts =
        MoeExpertWeights{gate_up.as<Bf16>(), down.as<Bf16>(), p.experts, p.hidden, p.inter};
    args.shared = p.shared.empty() ? nullptr : shared.as<Bf16>();
    args.out = out.as<Bf16>();
    args.max_tokens = max_tokens;
    args.path = variant.path;
    args.gemm_kernel = variant.kernel;
    args.workspace_bytes = MoeExpertsWorkspaceBytes(max_tokens, p.top_k, args.experts);
    workspace = Zeros(args.workspace_bytes);
    args.workspace = workspace.data();
  }

  std::vector<float> Output(int64_t tokens, int64_t hidden) const {
    return FromBf16(Download<Bf16>(out, tokens * hidden));
  }
};

std::vector<float> RunGpu(const Problem& p, Variant variant) {
  DeviceProblem d(p, variant, p.tokens + 3);  // a workspace larger than the step
  const absl::Status s = MoeExperts(d.args, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return d.Output(p.tokens, p.hidden);
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 10; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-2 + 2e-2 * std::fabs(want[i]))) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

constexpr Variant kGemvPairs{MoeExpertsPath::kGemvPairs, MoeGemmKernelKind::kAuto,
                             "pair-major gemv"};
constexpr Variant kGemv{MoeExpertsPath::kGemv, MoeGemmKernelKind::kAuto, "gemv"};
constexpr Variant kGemmMmaSync{MoeExpertsPath::kGroupedGemm, MoeGemmKernelKind::kMmaSync,
                               "grouped gemm, mma.sync"};
constexpr Variant kGemmAuto{MoeExpertsPath::kGroupedGemm, MoeGemmKernelKind::kAuto,
                            "grouped gemm, auto (wgmma on SM 9.0)"};

// Every variant that can run the problem's shapes.
std::vector<Variant> Variants(const Problem& p) {
  std::vector<Variant> v = {kGemvPairs, kGemv};
  if (MoeGroupedGemmSupports(p.hidden, p.inter)) {
    v.push_back(kGemmMmaSync);
    v.push_back(kGemmAuto);
  }
  return v;
}

void ExpectMatchesReference(const Problem& p) {
  const std::vector<float> want = Reference(p);
  for (Variant v : Variants(p)) {
    SCOPED_TRACE(v.name);
    ExpectClose(RunGpu(p, v), want);
  }
}

// ---- grouping ----

struct HostGroups {
  std::vector<int32_t> offsets, tile_start, active, row_token, pair_row;
};

HostGroups ExpectedGroups(const std::vector<int32_t>& ids, int top_k, int32_t first, int experts) {
  HostGroups h;
  h.pair_row.assign(ids.size(), -1);
  h.offsets.push_back(0);
  h.tile_start.push_back(0);
  h.active.push_back(0);
  for (int e = 0; e < experts; ++e) {
    int32_t count = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      if (ids[p] != first + e) continue;
      h.pair_row[p] = static_cast<int32_t>(h.row_token.size());
      h.row_token.push_back(static_cast<int32_t>(p / top_k));
      ++count;
    }
    h.offsets.push_back(h.offsets.back() + count);
    h.tile_start.push_back(h.tile_start.back() +
                           (count + kMoeGroupTileRows - 1) / kMoeGroupTileRows);
    if (count > 0) {
      h.active.push_back(e);
      ++h.active[0];
    }
  }
  return h;
}

void ExpectGrouping(const std::vector<int32_t>& ids, int64_t tokens, int top_k, int32_t first,
                    int experts) {
  const int64_t max_tokens = tokens + 5;
  DeviceBuffer dids = Upload(ids.empty() ? std::vector<int32_t>{0} : ids);
  DeviceBuffer base = Zeros(sizeof(int32_t) * MoeGroupsInts(max_tokens, top_k, experts));
  const MoeGroups g = CarveMoeGroups(base.as<int32_t>(), max_tokens, top_k, experts);
  ASSERT_TRUE(MoeGroupByExpert(dids.as<int32_t>(), tokens, first, g, nullptr).ok());
  ASSERT_TRUE(SynchronizeDevice().ok());
  const HostGroups want = ExpectedGroups(ids, top_k, first, experts);
  auto read = [](const int32_t* p, size_t n) {
    std::vector<int32_t> v(n);
    EXPECT_TRUE(CopyToHost(v.data(), p, n * sizeof(int32_t)).ok());
    return v;
  };
  EXPECT_EQ(read(g.offsets, experts + 1), want.offsets);
  EXPECT_EQ(read(g.tile_start, experts + 1), want.tile_start);
  EXPECT_EQ(read(g.active, want.active.size()), want.active);
  EXPECT_EQ(read(g.row_token, want.row_token.size()), want.row_token);
  EXPECT_EQ(read(g.pair_row, ids.size()), want.pair_row);
}

TEST(CudaMoeGroupingTest, MatchesAStableCountingSort) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const Problem p = RandomProblem(333, 8, 8, 1, 4, 16, 1);  // only the ids matter here
  ExpectGrouping(p.ids, 333, 4, 0, 16);
  // Expert parallelism: experts 4 .. 11 held here; the other pairs get no row.
  ExpectGrouping(p.ids, 333, 4, 4, 8);
  // The same on the one-CTA kernel (40 tokens: 160 pairs).
  const std::vector<int32_t> few(p.ids.begin(), p.ids.begin() + 160);
  ExpectGrouping(few, 40, 4, 0, 16);
  ExpectGrouping(few, 40, 4, 4, 8);
}

TEST(CudaMoeGroupingTest, EveryTokenToOneExpertAndEmptyExperts) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  // (Up to 1024 pairs run the one-CTA kernel, more the per-expert kernels.)
  ExpectGrouping(std::vector<int32_t>(1000, 5), 1000, 1, 0, 8);     // 8 tiles of expert 5
  ExpectGrouping(std::vector<int32_t>(3000, 5), 3000, 1, 0, 8);     // 24 tiles
  ExpectGrouping(std::vector<int32_t>(1024, 0), 1024, 1, 0, 1024);  // the largest one-CTA case
  ExpectGrouping(std::vector<int32_t>(1025, 0), 1025, 1, 0, 1024);
  std::vector<int32_t> two;
  for (int t = 0; t < 300; ++t) two.insert(two.end(), {6, 1});
  ExpectGrouping(two, 300, 2, 0, 64);
  ExpectGrouping({}, 0, 2, 0, 4);   // no token: no rows, no active expert
  ExpectGrouping({3}, 1, 1, 0, 4);  // one token
}

// ---- the expert block ----

TEST(CudaMoeExpertsTest, OneToken) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  ExpectMatchesReference(RandomProblem(1, 256, 128, 16, 4, 16, 10));
}

TEST(CudaMoeExpertsTest, MoreTokensThanExperts) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  ExpectMatchesReference(RandomProblem(45, 256, 128, 8, 2, 8, 20));
  ExpectMatchesReference(RandomProblem(200, 384, 192, 16, 4, 16, 21));
}

TEST(CudaMoeExpertsTest, ShapesTheGemmDoesNotTileTakeTheGemv) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const Problem p = RandomProblem(9, 72, 40, 6, 3, 6, 30);
  ASSERT_FALSE(MoeGroupedGemmSupports(p.hidden, p.inter));
  ExpectMatchesReference(p);
  EXPECT_EQ(MoeExpertsPathFor(1000, MoeExpertWeights{nullptr, nullptr, 6, 72, 40}),
            MoeExpertsPath::kGemv);
  EXPECT_EQ(MoeExpertsPathFor(1, MoeExpertWeights{nullptr, nullptr, 6, 72, 40}),
            MoeExpertsPath::kGemvPairs);
}

TEST(CudaMoeExpertsTest, EveryTokenToOneExpert) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem p = RandomProblem(300, 256, 128, 8, 2, 8, 40);  // 300 rows: 3 GEMM tiles
  for (int64_t t = 0; t < p.tokens; ++t) {
    p.ids[t * 2] = 3;
    p.ids[t * 2 + 1] = 6;
  }
  ExpectMatchesReference(p);
}

TEST(CudaMoeExpertsTest, ExpertsWithoutTokensAreNotRead) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem p = RandomProblem(130, 256, 128, 8, 2, 8, 50);
  for (int64_t t = 0; t < p.tokens; ++t) {
    p.ids[t * 2] = t % 3 == 0 ? 2 : 5;
    p.ids[t * 2 + 1] = 7;
  }
  const std::vector<float> want = Reference(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int e : {0, 1, 3, 4, 6}) {
    std::fill_n(p.gate_up.begin() + e * 2 * p.inter * p.hidden, 2 * p.inter * p.hidden, nan);
    std::fill_n(p.down.begin() + e * p.hidden * p.inter, p.hidden * p.inter, nan);
  }
  for (Variant v : Variants(p)) {
    SCOPED_TRACE(v.name);
    ExpectClose(RunGpu(p, v), want);
  }
}

TEST(CudaMoeExpertsTest, ExpertParallelRankSumsOnlyItsExperts) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  // 16 global experts, this rank holds 8 .. 15.
  Problem p = RandomProblem(150, 256, 128, 8, 4, 16, 60);
  p.first_expert = 8;
  ExpectMatchesReference(p);
}

TEST(CudaMoeExpertsTest, AddsTheSharedExpertsOutput) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem p = RandomProblem(70, 256, 128, 8, 2, 8, 70);
  p.shared = RandomBf16Floats(p.tokens * p.hidden, 71);
  ExpectMatchesReference(p);
}

TEST(CudaMoeExpertsTest, OutputDoesNotDependOnTheRoutersOrder) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem p = RandomProblem(20, 256, 128, 8, 3, 8, 80);
  Problem swapped = p;
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::swap(swapped.ids[t * 3], swapped.ids[t * 3 + 2]);
    std::swap(swapped.weights[t * 3], swapped.weights[t * 3 + 2]);
  }
  for (Variant v : Variants(p)) EXPECT_EQ(RunGpu(p, v), RunGpu(swapped, v)) << v.name;
}

// The CPU op of Op::kMoeExperts (kernels/cpu/moe_experts.h: fp32 through,
// the same weight layout and combine order) on the same inputs: the GPU's
// bf16 roundings put it within 3e-2 of the largest output, while a layout
// difference (gate/up order, expert ids, transposes) would be O(1) off.
TEST(CudaMoeExpertsTest, MatchesTheCpuOpWithinBf16Roundings) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem p = RandomProblem(40, 256, 128, 8, 4, 16, 110);
  p.first_expert = 4;  // experts 4 .. 11 held here
  std::vector<cpu::WeightMatrix> gate_up, down;
  for (int e = 0; e < p.experts; ++e) {
    gate_up.push_back(
        {&p.gate_up[e * 2 * p.inter * p.hidden], cpu::DType::kF32, 2 * p.inter, p.hidden});
    down.push_back({&p.down[e * p.hidden * p.inter], cpu::DType::kF32, p.hidden, p.inter});
  }
  std::vector<float> want(p.tokens * p.hidden);
  cpu::MoeExpertsArgs a;
  a.x = p.x.data();
  a.num_tokens = p.tokens;
  a.hidden = p.hidden;
  a.gate_up = gate_up;
  a.down = down;
  a.first_expert = p.first_expert;
  a.ids = p.ids.data();
  a.weights = p.weights.data();
  a.top_k = p.top_k;
  a.out = want.data();
  ASSERT_TRUE(cpu::ValidateMoeExperts(a).ok());
  cpu::reference::MoeExperts(a);
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.1f);
  for (Variant v : Variants(p)) {
    SCOPED_TRACE(v.name);
    const std::vector<float> got = RunGpu(p, v);
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, 3e-2f * scale);
  }
}

// Each stage of the two paths on the same groups, so that a failure above
// names the kernel: gate/up (act) and down (y) of the GEMV and the GEMM
// agree to bf16 roundings, and the GEMV's act matches the host's.
TEST(CudaMoeExpertsTest, GemvAndGroupedGemmStagesAgree) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const Problem p = RandomProblem(300, 256, 128, 8, 2, 8, 100);
  DeviceProblem d(p, kGemv, p.tokens);
  DeviceBuffer base = Zeros(sizeof(int32_t) * MoeGroupsInts(p.tokens, p.top_k, p.experts));
  const MoeGroups g = CarveMoeGroups(base.as<int32_t>(), p.tokens, p.top_k, p.experts);
  ASSERT_TRUE(MoeGroupByExpert(d.args.ids, p.tokens, 0, g, nullptr).ok());
  const int64_t rows = p.tokens * p.top_k;
  DeviceBuffer act_gemv = Zeros(sizeof(Bf16) * rows * p.inter);
  DeviceBuffer act_gemm = Zeros(sizeof(Bf16) * rows * p.inter);
  DeviceBuffer y_gemv = Zeros(sizeof(Bf16) * rows * p.hidden);
  DeviceBuffer y_gemm = Zeros(sizeof(Bf16) * rows * p.hidden);
  const MoeExpertWeights& w = d.args.experts;
  ASSERT_TRUE(MoeGemvGateUp(d.args.x, p.tokens, w, g, act_gemv.as<Bf16>(), nullptr).ok());
  const std::vector<float> act = FromBf16(Download<Bf16>(act_gemv, rows * p.inter));
  for (Variant v : {kGemmMmaSync, kGemmAuto}) {
    SCOPED_TRACE(testing::Message() << "gate/up: " << v.name << " vs GEMV");
    ASSERT_TRUE(MemsetDevice(act_gemm.data(), 0, act_gemm.size()).ok());
    ASSERT_TRUE(
        MoeGemmGateUp(d.args.x, p.tokens, w, g, act_gemm.as<Bf16>(), nullptr, v.kernel).ok());
    ExpectClose(FromBf16(Download<Bf16>(act_gemm, rows * p.inter)), act);
  }
  // The host's act of every row of expert 0 .. 7 in grouped (expert, token) order.
  std::vector<float> want_act;
  for (int e = 0; e < p.experts; ++e) {
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int j = 0; j < p.top_k; ++j) {
        if (p.ids[t * p.top_k + j] != e) continue;
        for (int64_t n = 0; n < p.inter; ++n) {
          const float* gr = &p.gate_up[(e * 2 * p.inter + n) * p.hidden];
          const float* ur = gr + p.inter * p.hidden;
          double gs = 0, us = 0;
          for (int64_t h = 0; h < p.hidden; ++h) {
            gs += double{p.x[t * p.hidden + h]} * gr[h];
            us += double{p.x[t * p.hidden + h]} * ur[h];
          }
          const float gb = RoundBf16(static_cast<float>(gs)),
                      ub = RoundBf16(static_cast<float>(us));
          want_act.push_back(RoundBf16(gb / (1.0f + std::exp(-gb)) * ub));
        }
      }
    }
  }
  {
    SCOPED_TRACE("gate/up: GEMV vs host");
    ExpectClose(act, want_act);
  }
  // Down from the same act on both paths.
  ASSERT_TRUE(MoeGemvDown(act_gemv.as<Bf16>(), p.tokens, w, g, y_gemv.as<Bf16>(), nullptr).ok());
  const std::vector<float> y = FromBf16(Download<Bf16>(y_gemv, rows * p.hidden));
  for (Variant v : {kGemmMmaSync, kGemmAuto}) {
    SCOPED_TRACE(testing::Message() << "down: " << v.name << " vs GEMV");
    ASSERT_TRUE(MemsetDevice(y_gemm.data(), 0, y_gemm.size()).ok());
    ASSERT_TRUE(
        MoeGemmDown(act_gemv.as<Bf16>(), p.tokens, w, g, y_gemm.as<Bf16>(), nullptr, v.kernel)
            .ok());
    ExpectClose(FromBf16(Download<Bf16>(y_gemm, rows * p.hidden)), y);
  }
}

// The pair-major path computes every row as the grouped GEMV does and sums
// in the same order: equal bits, also with shared experts and pairs held
// elsewhere, and when tokens share experts.
TEST(CudaMoeExpertsTest, PairGemvEqualsTheGroupedGemvBitwise) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Problem one = RandomProblem(1, 256, 128, 16, 8, 16, 120);
  Problem ep = RandomProblem(7, 384, 192, 8, 4, 16, 121);
  ep.first_expert = 8;
  ep.shared = RandomBf16Floats(ep.tokens * ep.hidden, 122);
  Problem odd = RandomProblem(5, 72, 40, 6, 3, 6, 123);  // 15 pairs on 6 experts
  // Wider than the prefetched kernels' registers hold (2048 gate/up
  // columns, 768 down columns): their tail loops run too.
  Problem wide = RandomProblem(2, 2304, 1032, 4, 2, 4, 124);
  Problem many = RandomProblem(20, 256, 128, 4, 2, 4, 125);  // ~10 rows per expert: 2 passes
  for (const Problem* p : {&one, &ep, &odd, &wide, &many}) {
    const std::vector<float> grouped = RunGpu(*p, kGemv);
    EXPECT_EQ(RunGpu(*p, kGemvPairs), grouped) << p->tokens << " tokens";
  }
}

// kWgmma runs on SM 9.0 (the H200) and gives the mma.sync kernel's act up
// to fp32 summation order; elsewhere it is refused, never silently replaced.
TEST(CudaMoeExpertsTest, WgmmaKernelRunsOnSm90AndIsRefusedElsewhere) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const CudaQueryResult q = QueryCudaDevices();
  bool sm90 = false;  // device 0, the one TESSERA_REQUIRE_CUDA_DEVICE selects
  for (const CudaDeviceInfo& dev : q.info.devices) {
    if (dev.ordinal == 0) sm90 = dev.sm_major == 9 && dev.sm_minor == 0;
  }
  const Problem p = RandomProblem(200, 256, 128, 8, 2, 8, 130);
  DeviceProblem d(p, kGemv, p.tokens);
  DeviceBuffer base = Zeros(sizeof(int32_t) * MoeGroupsInts(p.tokens, p.top_k, p.experts));
  const MoeGroups g = CarveMoeGroups(base.as<int32_t>(), p.tokens, p.top_k, p.experts);
  ASSERT_TRUE(MoeGroupByExpert(d.args.ids, p.tokens, 0, g, nullptr).ok());
  const int64_t rows = p.tokens * p.top_k;
  DeviceBuffer mma = Zeros(sizeof(Bf16) * rows * p.inter);
  DeviceBuffer wg = Zeros(sizeof(Bf16) * rows * p.inter);
  const MoeExpertWeights& w = d.args.experts;
  ASSERT_TRUE(
      MoeGemmGateUp(d.args.x, p.tokens, w, g, mma.as<Bf16>(), nullptr, MoeGemmKernelKind::kMmaSync)
          .ok());
  const absl::Status s =
      MoeGemmGateUp(d.args.x, p.tokens, w, g, wg.as<Bf16>(), nullptr, MoeGemmKernelKind::kWgmma);
  if (!sm90) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return;
  }
  ASSERT_TRUE(s.ok()) << s;
  ExpectClose(FromBf16(Download<Bf16>(wg, rows * p.inter)),
              FromBf16(Download<Bf16>(mma, rows * p.inter)));
}

// Captured once, replayed with other ids and weights in the same buffers:
// the grouping and both GEMM launches read the new counts on the device.
TEST(CudaMoeExpertsTest, ReplaysACapturedGraphWithNewRouting) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (Variant v : {kGemvPairs, kGemv, kGemmMmaSync, kGemmAuto}) {
    SCOPED_TRACE(v.name);
    Problem p = RandomProblem(160, 256, 128, 16, 4, 16, 90);
    DeviceProblem d(p, v, p.tokens);
    absl::StatusOr<Stream> stream = Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status();
    ASSERT_TRUE(MoeExperts(d.args, stream->get()).ok());  // warm up outside the capture
    CudaGraph graph;
    ASSERT_TRUE(CaptureGraph(stream->get(), &graph, [&] {
                  return MoeExperts(d.args, stream->get());
                }).ok());
    // The new routing uses experts 0 .. 5 only: other counts, experts 6 .. 15 empty.
    const Problem q = RandomProblem(160, 256, 128, 16, 4, 6, 91);
    p.ids = q.ids;
    p.weights = q.weights;
    ASSERT_TRUE(CopyToDevice(d.ids.data(), p.ids.data(), p.ids.size() * sizeof(int32_t)).ok());
    ASSERT_TRUE(
        CopyToDevice(d.weights.data(), p.weights.data(), p.weights.size() * sizeof(float)).ok());
    ASSERT_TRUE(Synchronize(nullptr).ok());  // the graph's stream does not wait for the default one
    ASSERT_TRUE(graph.Launch(stream->get()).ok());
    ASSERT_TRUE(Synchronize(stream->get()).ok());
    ExpectClose(d.Output(p.tokens, p.hidden), Reference(p));
  }
}

// ---- validation (host) ----

MoeExpertsArgs FakeArgs() {
  // Never dereferenced: every case fails validation first.
  auto* fake = reinterpret_cast<Bf16*>(uintptr_t{1} << 20);
  MoeExpertsArgs a;
  a.x = fake;
  a.num_tokens = 4;
  a.ids = reinterpret_cast<const int32_t*>(fake);
  a.weights = reinterpret_cast<const float*>(fake);
  a.top_k = 2;
  a.experts = MoeExpertWeights{fake, fake, 8, 256, 128};
  a.out = fake;
  a.max_tokens = 8;
  a.workspace = fake;
  a.workspace_bytes = MoeExpertsWorkspaceBytes(8, 2, a.experts);
  return a;
}

TEST(CudaMoeExpertsValidation, RefusesBadArgumentsOnTheHost) {
  MoeExpertsArgs a = FakeArgs();
  a.workspace_bytes -= 1;
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("workspace"));
  a = FakeArgs();
  a.num_tokens = 9;
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("num_tokens"));
  a = FakeArgs();
  a.top_k = 0;
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("top_k"));
  a = FakeArgs();
  a.experts.inter = 12;
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("multiples of 8"));
  a = FakeArgs();
  a.experts.inter = 40;
  a.path = MoeExpertsPath::kGroupedGemm;
  a.workspace_bytes = MoeExpertsWorkspaceBytes(8, 2, a.experts);
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("does not tile"));
  a = FakeArgs();
  a.experts.gate_up = nullptr;
  EXPECT_THAT(MoeExperts(a, nullptr).message(), HasSubstr("unset"));
}

TEST(CudaMoeExpertsValidation, GroupingRefusesMoreTokensThanItWasSizedFor) {
  MoeGroups g = CarveMoeGroups(reinterpret_cast<int32_t*>(uintptr_t{1} << 20), 4, 2, 8);
  EXPECT_THAT(MoeGroupByExpert(g.offsets, 5, 0, g, nullptr).message(), HasSubstr("num_tokens"));
  EXPECT_EQ(MoeMaxGemmTiles(4096, 8, 128), 256 + 128);
  EXPECT_EQ(MoeMaxActiveExperts(1, 8, 128), 8);
}

}  // namespace
}  // namespace tessera::kernels::cuda
