// Device-side MoE routing against the CPU reference (kernels/cpu/
// moe_routing.h): both scorings on random logits, the tie rule, a worked
// grouped example, every token to one expert, one token, many tokens, and
// a run inside a captured CUDA graph. Validation cases run on the host.
//
// Tolerances: expert ids must be equal (random logits have no near-ties at
// fp32 resolution); weights within 4e-6 relative (expf vs the host's exp,
// and the softmax denominator summed in a tree instead of in sequence:
// about sqrt(E) ulps apart).
#include "kernels/cuda/moe_routing.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"

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

}  // namespace
}  // namespace tessera::kernels::cuda
