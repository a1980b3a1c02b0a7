// Device-side MoE routing against the CPU reference (kernels/cpu/
// moe_routing.h): both scorings on random logits, the tie rule, a worked
// grouped example, every token to one expert, one token, many tokens, and
// a run inside a captured CUDA graph; and the fp32 router (moe_router.h):
// the fused kernel's logits against the host's fp32 RMSNorm and router
// product, its routing against the CPU reference on those logits, its
// counters left zero for graph replays, and the hi/lo split carrying x.
// Validation cases run on the host.
//
// Tolerances: expert ids must be equal (random logits have no near-ties at
// fp32 resolution); weights within 4e-6 relative (expf vs the host's exp,
// and the softmax denominator summed in a tree instead of in sequence:
// about sqrt(E) ulps apart).
#include "kernels/cuda/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_router.h"

namespace tessera::kernels::cuda {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace cuda_testing;  // NOLINT

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

cpu::MoeRoutingParams CpuParams(const MoeRoutingParams& p, const std::vector<float>& bias) {
  cpu::MoeRoutingParams c;
  c.scoring = p.scoring == MoeScoring::kSoftmax ? cpu::MoeScoringFunction::kSoftmax
                                                : cpu::MoeScoringFunction::kSigmoidGrouped;
  c.num_experts = p.num_experts;
  c.top_k = p.top_k;
  c.renormalize = p.renormalize;
  c.num_groups = p.num_groups;
  c.topk_groups = p.topk_groups;
  c.scaling_factor = p.scaling_factor;
  c.correction_bias = bias.empty() ? nullptr : bias.data();
  return c;
}

Routed CpuRoute(const std::vector<float>& logits, const MoeRoutingParams& p,
                const std::vector<float>& bias) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / p.num_experts;
  Routed r{std::vector<int32_t>(tokens * p.top_k), std::vector<float>(tokens * p.top_k)};
  cpu::reference::MoeRoute(logits.data(), tokens, CpuParams(p, bias), r.ids.data(),
                           r.weights.data());
  return r;
}

Routed GpuRoute(const std::vector<float>& logits, MoeRoutingParams p,
                const std::vector<float>& bias) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / p.num_experts;
  DeviceBuffer dlogits = Upload(logits);
  DeviceBuffer dbias = bias.empty() ? DeviceBuffer() : Upload(bias);
  DeviceBuffer dids = Zeros(sizeof(int32_t) * tokens * p.top_k + 4);
  DeviceBuffer dw = Zeros(sizeof(float) * tokens * p.top_k + 4);
  p.correction_bias = dbias.as<float>();
  const absl::Status s =
      MoeRoute(dlogits.as<float>(), tokens, p, dids.as<int32_t>(), dw.as<float>(), nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return Routed{Download<int32_t>(dids, tokens * p.top_k), Download<float>(dw, tokens * p.top_k)};
}

void ExpectSameRouting(const Routed& got, const Routed& want) {
  ASSERT_EQ(got.ids.size(), want.ids.size());
  EXPECT_EQ(got.ids, want.ids);
  for (size_t i = 0; i < want.weights.size(); ++i) {
    EXPECT_NEAR(got.weights[i], want.weights[i], 4e-6 * std::fabs(want.weights[i]) + 1e-12)
        << "pair " << i;
  }
}

MoeRoutingParams Softmax(int experts, int k, bool renormalize) {
  MoeRoutingParams p;
  p.num_experts = experts;
  p.top_k = k;
  p.renormalize = renormalize;
  return p;
}

MoeRoutingParams Grouped(int experts, int k, int groups, int keep, float scale) {
  MoeRoutingParams p;
  p.scoring = MoeScoring::kSigmoidGrouped;
  p.num_experts = experts;
  p.top_k = k;
  p.renormalize = true;
  p.num_groups = groups;
  p.topk_groups = keep;
  p.scaling_factor = scale;
  return p;
}

TEST(CudaMoeRoutingTest, SoftmaxMatchesTheCpuReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (bool renormalize : {true, false}) {
    for (int tokens : {1, 37, 300}) {  // one token; more tokens than experts
      const std::vector<float> logits = RandomFloats(tokens * 128, 7 + tokens, -4.f, 4.f);
      const MoeRoutingParams p = Softmax(128, 8, renormalize);
      SCOPED_TRACE(testing::Message() << "tokens " << tokens << " renormalize " << renormalize);
      ExpectSameRouting(GpuRoute(logits, p, {}), CpuRoute(logits, p, {}));
    }
  }
}

TEST(CudaMoeRoutingTest, SigmoidGroupedMatchesTheCpuReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const std::vector<float> bias = RandomFloats(256, 3, -0.5f, 0.5f);
  struct Case {
    int groups, keep;
    bool renormalize;
  };
  for (Case c : {Case{8, 4, true}, Case{8, 4, false}, Case{1, 1, true}, Case{16, 3, true}}) {
    MoeRoutingParams p = Grouped(256, 8, c.groups, c.keep, 2.5f);
    p.renormalize = c.renormalize;
    const std::vector<float> logits = RandomFloats(65 * 256, 11, -3.f, 3.f);
    SCOPED_TRACE(testing::Message() << "groups " << c.groups << " keep " << c.keep);
    ExpectSameRouting(GpuRoute(logits, p, bias), CpuRoute(logits, p, bias));
    ExpectSameRouting(GpuRoute(logits, p, {}), CpuRoute(logits, p, {}));  // no bias
  }
}

TEST(CudaMoeRoutingTest, TiesGoToTheLowerExpert) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  MoeRoutingParams p = Softmax(5, 3, true);
  EXPECT_THAT(GpuRoute({1, 5, 0, 5, 5}, p, {}).ids, ElementsAre(1, 3, 4));
  p.top_k = 5;
  EXPECT_THAT(GpuRoute({2, 2, 2, 2, 2}, p, {}).ids, ElementsAre(0, 1, 2, 3, 4));
  // 300 equal logits: every token takes experts 0 .. 7 (also "every token
  // to the same experts"), each with weight 1/8.
  p = Softmax(300, 8, true);
  const Routed r = GpuRoute(std::vector<float>(4 * 300, 0.5f), p, {});
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(r.ids[t * 8 + j], j);
      EXPECT_FLOAT_EQ(r.weights[t * 8 + j], 0.125f);
    }
  }
  // Grouped: all groups tie, the lower ones are kept.
  const MoeRoutingParams g = Grouped(16, 4, 4, 2, 1.0f);
  EXPECT_THAT(GpuRoute(std::vector<float>(16, 0.0f), g, {}).ids, ElementsAre(0, 1, 2, 3));
}

// The CPU test's worked example (moe_ops_test.cc): bias moves expert 5 up,
// expert 0's group loses although expert 0 has the third-best choice score,
// and 2 beats 3 on a tie; weights come from the unbiased sigmoid.
TEST(CudaMoeRoutingTest, SigmoidGroupedWorkedExample) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const std::vector<float> bias = {0.25f, -0.3f, 0.1f, 0.1f, 0, 0.3f, 0, 0};
  const std::vector<float> logits = {0, 0, 0, 0, 0, 1, 0, 0};
  MoeRoutingParams p = Grouped(8, 2, 4, 2, 1.0f);
  const Routed r = GpuRoute(logits, p, bias);
  EXPECT_THAT(r.ids, ElementsAre(5, 2));
  const double s5 = 1.0 / (1.0 + std::exp(-1.0)), s2 = 0.5;
  EXPECT_NEAR(r.weights[0], s5 / (s5 + s2), 1e-6);
  EXPECT_NEAR(r.weights[1], s2 / (s5 + s2), 1e-6);
  ExpectSameRouting(r, CpuRoute(logits, p, bias));
}

TEST(CudaMoeRoutingTest, RunsInACapturedGraph) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const MoeRoutingParams p = Softmax(64, 4, true);
  std::vector<float> logits = RandomFloats(16 * 64, 5, -2.f, 2.f);
  DeviceBuffer dlogits = Upload(logits);
  DeviceBuffer dids = Zeros(sizeof(int32_t) * 16 * 4);
  DeviceBuffer dw = Zeros(sizeof(float) * 16 * 4);
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaGraph graph;
  ASSERT_TRUE(CaptureGraph(stream->get(), &graph, [&] {
                return MoeRoute(dlogits.as<float>(), 16, p, dids.as<int32_t>(), dw.as<float>(),
                                stream->get());
              }).ok());
  // New logits in the same buffer: the replay routes them.
  logits = RandomFloats(16 * 64, 6, -2.f, 2.f);
  ASSERT_TRUE(CopyToDevice(dlogits.data(), logits.data(), logits.size() * sizeof(float)).ok());
  ASSERT_TRUE(Synchronize(nullptr).ok());  // the graph's stream does not wait for the default one
  ASSERT_TRUE(graph.Launch(stream->get()).ok());
  ASSERT_TRUE(Synchronize(stream->get()).ok());
  ExpectSameRouting(Routed{Download<int32_t>(dids, 64), Download<float>(dw, 64)},
                    CpuRoute(logits, p, {}));
}

TEST(CudaMoeRoutingValidation, RefusesBadParametersOnTheHost) {
  MoeRoutingParams p = Softmax(8, 0, true);
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("top_k"));
  p.top_k = 9;
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("top_k"));
  p = Softmax(kMoeRoutingMaxExperts + 1, 2, true);
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("num_experts"));
  p = Grouped(12, 2, 5, 1, 1.0f);
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("num_groups"));
  p = Grouped(12, 2, 4, 5, 1.0f);
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("topk_groups"));
  p = Grouped(12, 7, 4, 2, 1.0f);  // 2 groups of 3 hold 6 experts
  EXPECT_THAT(ValidateMoeRouting(p).message(), HasSubstr("exceeds"));
  EXPECT_TRUE(ValidateMoeRouting(Grouped(12, 6, 4, 2, 1.0f)).ok());
  // The launcher refuses before touching the (null) device pointers.
  const absl::Status s = MoeRoute(nullptr, 4, Softmax(8, 0, true), nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeRoute(nullptr, 4, Softmax(8, 2, true), nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// The host's router for residual rows: x = (r * inv_rms) * w (the CPU
// reference's RMSNorm), logits = x . router (router values bf16), in
// double. `bound` gets each logit's sum of |x w| (its rounding scale).
std::vector<float> HostRouterLogits(const std::vector<float>& residual,
                                    const std::vector<float>& norm,
                                    const std::vector<float>& router, int64_t H, int E, float eps,
                                    std::vector<double>* bound) {
  const int64_t T = static_cast<int64_t>(residual.size()) / H;
  std::vector<float> logits(T * E);
  bound->assign(T * E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) ss += double{residual[t * H + h]} * residual[t * H + h];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / H + eps));
    for (int e = 0; e < E; ++e) {
      double dot = 0, mag = 0;
      for (int64_t h = 0; h < H; ++h) {
        const double x = (residual[t * H + h] * inv) * norm[h];
        dot += x * router[e * H + h];
        mag += std::fabs(x * router[e * H + h]);
      }
      logits[t * E + e] = static_cast<float>(dot);
      (*bound)[t * E + e] = mag;
    }
  }
  return logits;
}

std::vector<Bf16> ToBf16Vector(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

struct FusedRouterCase {
  int64_t tokens, hidden;
  MoeRoutingParams p;
};

TEST(CudaMoeRouterTest, FusedRouterMatchesTheHostAndTheCpuRouting) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const std::vector<float> bias = RandomFloats(16, 9, -0.2f, 0.2f);
  for (const FusedRouterCase& c :
       {FusedRouterCase{1, 2048, Softmax(128, 8, true)},
        FusedRouterCase{7, 2048, Softmax(128, 8, true)},
        FusedRouterCase{64, 2048, Softmax(128, 8, false)},
        FusedRouterCase{3, 4096, Softmax(64, 6, true)},
        FusedRouterCase{5, 128, Softmax(8, 2, true)},  // one CTA per token: no counters
        FusedRouterCase{9, 128, Grouped(16, 4, 4, 2, 2.5f)}}) {
    SCOPED_TRACE(testing::Message() << "tokens " << c.tokens << " hidden " << c.hidden
                                    << " experts " << c.p.num_experts);
    const int64_t T = c.tokens, H = c.hidden;
    const int E = c.p.num_experts, k = c.p.top_k;
    const std::vector<float> residual = RandomFloats(T * H, 21 + T, -3.f, 3.f);
    const std::vector<float> norm = RandomFloats(H, 22, 0.5f, 1.5f);
    const std::vector<float> router = RandomBf16Floats(E * H, 23, -0.1f, 0.1f);
    const bool grouped = c.p.scoring == MoeScoring::kSigmoidGrouped;
    DeviceBuffer dres = Upload(residual), dnorm = Upload(norm),
                 drouter = Upload(ToBf16Vector(router));
    DeviceBuffer dbias = grouped ? Upload(bias) : DeviceBuffer();
    DeviceBuffer dlogits = Zeros(sizeof(float) * T * E), dcounters = Zeros(sizeof(int32_t) * T);
    DeviceBuffer dids = Zeros(sizeof(int32_t) * T * k), dw = Zeros(sizeof(float) * T * k);
    MoeRouterArgs a;
    a.residual = dres.as<float>();
    a.norm = dnorm.as<float>();
    a.eps = 1e-6f;
    a.num_tokens = T;
    a.hidden = H;
    a.router = drouter.as<Bf16>();
    a.routing = c.p;
    a.routing.correction_bias = dbias.as<float>();
    a.logits = dlogits.as<float>();
    a.counters = dcounters.as<int32_t>();
    a.experts = dids.as<int32_t>();
    a.weights = dw.as<float>();
    for (int call = 0; call < 2; ++call) {  // the second call finds the counters zeroed
      ASSERT_TRUE(MoeRouteFromResidual(a, nullptr).ok());
      std::vector<double> bound;
      const std::vector<float> want = HostRouterLogits(residual, norm, router, H, E, 1e-6f, &bound);
      const std::vector<float> got = Download<float>(dlogits, T * E);
      for (int64_t i = 0; i < T * E; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * bound[i] + 1e-6) << "logit " << i;
      }
      // The routing of the logits the kernel computed, as the CPU routes them.
      ExpectSameRouting(Routed{Download<int32_t>(dids, T * k), Download<float>(dw, T * k)},
                        CpuRoute(got, c.p, grouped ? bias : std::vector<float>{}));
      EXPECT_EQ(Download<int32_t>(dcounters, T), std::vector<int32_t>(T, 0));
    }
  }
}

TEST(CudaMoeRouterTest, FusedRouterReplaysInACapturedGraph) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t T = 4, H = 256;
  const MoeRoutingParams p = Softmax(32, 4, true);
  std::vector<float> residual = RandomFloats(T * H, 31, -2.f, 2.f);
  const std::vector<float> norm = RandomFloats(H, 32, 0.5f, 1.5f);
  const std::vector<float> router = RandomBf16Floats(32 * H, 33, -0.2f, 0.2f);
  DeviceBuffer dres = Upload(residual), dnorm = Upload(norm),
               drouter = Upload(ToBf16Vector(router));
  DeviceBuffer dlogits = Zeros(sizeof(float) * T * 32), dcounters = Zeros(sizeof(int32_t) * T);
  DeviceBuffer dids = Zeros(sizeof(int32_t) * T * 4), dw = Zeros(sizeof(float) * T * 4);
  MoeRouterArgs a;
  a.residual = dres.as<float>();
  a.norm = dnorm.as<float>();
  a.num_tokens = T;
  a.hidden = H;
  a.router = drouter.as<Bf16>();
  a.routing = p;
  a.logits = dlogits.as<float>();
  a.counters = dcounters.as<int32_t>();
  a.experts = dids.as<int32_t>();
  a.weights = dw.as<float>();
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  CudaGraph graph;
  ASSERT_TRUE(CaptureGraph(stream->get(), &graph, [&] {
                return MoeRouteFromResidual(a, stream->get());
              }).ok());
  for (uint32_t replay = 0; replay < 3; ++replay) {
    residual = RandomFloats(T * H, 40 + replay, -2.f, 2.f);
    ASSERT_TRUE(CopyToDevice(dres.data(), residual.data(), residual.size() * sizeof(float)).ok());
    ASSERT_TRUE(Synchronize(nullptr).ok());
    ASSERT_TRUE(graph.Launch(stream->get()).ok());
    ASSERT_TRUE(Synchronize(stream->get()).ok());
    std::vector<double> bound;
    const std::vector<float> want = HostRouterLogits(residual, norm, router, H, 32, 1e-6f, &bound);
    const std::vector<float> got = Download<float>(dlogits, T * 32);
    for (int64_t i = 0; i < T * 32; ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * bound[i] + 1e-6);
    ExpectSameRouting(Routed{Download<int32_t>(dids, T * 4), Download<float>(dw, T * 4)},
                      CpuRoute(got, p, {}));
  }
}

// hi + lo carries x to about 2^-17 relative; MoeRoute with the addend
// routes the sum.
TEST(CudaMoeRouterTest, SplitInputCarriesTheFp32RowAndRouteAddsTheHalves) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t T = 70, H = 512;
  const std::vector<float> residual = RandomFloats(T * H, 51, -3.f, 3.f);
  const std::vector<float> norm = RandomFloats(H, 52, 0.5f, 1.5f);
  DeviceBuffer dres = Upload(residual), dnorm = Upload(norm);
  DeviceBuffer dsplit = Zeros(sizeof(Bf16) * 2 * T * H);
  ASSERT_TRUE(MoeRouterSplitInput(dres.as<float>(), dnorm.as<float>(), 1e-6f, T, H,
                                  dsplit.as<Bf16>(), nullptr)
                  .ok());
  const std::vector<Bf16> split = Download<Bf16>(dsplit, 2 * T * H);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) ss += double{residual[t * H + h]} * residual[t * H + h];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / H + 1e-6));
    for (int64_t h = 0; h < H; ++h) {
      const float x = (residual[t * H + h] * inv) * norm[h];
      const float hi = Bf16ToFloat(split[t * H + h]), lo = Bf16ToFloat(split[(T + t) * H + h]);
      ASSERT_NEAR(hi + lo, x, std::ldexp(std::fabs(x), -16)) << "token " << t << " dim " << h;
      EXPECT_NEAR(hi, x, std::ldexp(std::fabs(x), -8));
    }
  }
  const MoeRoutingParams p = Softmax(64, 8, true);
  const std::vector<float> a = RandomFloats(T * 64, 53, -2.f, 2.f);
  const std::vector<float> b = RandomFloats(T * 64, 54, -0.01f, 0.01f);
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  DeviceBuffer da = Upload(a), db = Upload(b);
  DeviceBuffer dids = Zeros(sizeof(int32_t) * T * 8), dw = Zeros(sizeof(float) * T * 8);
  ASSERT_TRUE(
      MoeRoute(da.as<float>(), T, p, dids.as<int32_t>(), dw.as<float>(), nullptr, db.as<float>())
          .ok());
  ExpectSameRouting(Routed{Download<int32_t>(dids, T * 8), Download<float>(dw, T * 8)},
                    CpuRoute(sum, p, {}));
}

TEST(CudaMoeRoutingValidation, RouterRefusesBadArgumentsOnTheHost) {
  MoeRouterArgs a;
  a.routing = Softmax(128, 8, true);
  a.hidden = 2048;
  a.num_tokens = 1;
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("residual"));
  std::vector<float> host(8);
  a.residual = host.data();  // host pointers: refused before any launch
  a.norm = host.data();
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("counters"));
  a.num_tokens = kMoeFusedRouterMaxTokens + 1;
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("num_tokens"));
  a.num_tokens = 1;
  a.hidden = 2044;
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("hidden"));
  a.hidden = kMoeRouterMaxHidden + 8;
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("hidden"));
  a.hidden = 2048;
  a.routing.top_k = 0;
  EXPECT_THAT(MoeRouteFromResidual(a, nullptr).message(), HasSubstr("top_k"));
  EXPECT_THAT(
      MoeRouterSplitInput(host.data(), host.data(), 1e-6f, 4, 12, nullptr, nullptr).message(),
      HasSubstr("hidden"));
  EXPECT_THAT(
      MoeRouterSplitInput(host.data(), host.data(), 1e-6f, 4, 16, nullptr, nullptr).message(),
      HasSubstr("split"));
}

}  // namespace
}  // namespace tessera::kernels::cuda
