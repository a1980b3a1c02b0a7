// Routing parity with transformers: for every prompt token of the MoE
// fixtures (tests/fixtures/models/qwen3_moe_tiny, glm4_moe_tiny; made by
// tests/gpu/make_moe_fixtures.py), every sparse layer's router, fed the
// hidden states of Tessera's own forward pass, chooses the same experts
// with the same weights as transformers' router module did.
//
// Comparison per token: the chosen experts as sorted sets must be equal,
// and each expert's weight within 1e-5 (weights are O(1), up to the 2.5
// scaling factor; the inputs differ from transformers' by float32 rounding
// of the layers before). The router logits must agree within 1e-4.
//
// Near-ties: when, in the reference's own (double-precision) recomputation
// from its logits, the k-th and (k+1)-th choice scores, or the last kept
// and first dropped group scores, differ by less than 1e-6, rounding may
// legitimately flip the choice; such tokens skip the set comparison and are
// counted. The fixtures have none (the test expects 0 skips).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::runner {
namespace {

constexpr double kNearTie = 1e-6;
constexpr float kWeightTolerance = 1e-5f;
constexpr float kLogitTolerance = 1e-4f;

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

// Keeps the last forward step's routing of every sparse layer.
class Recorder : public MoeRoutingObserver {
 public:
  struct Step {
    int top_k = 0;
    std::vector<float> logits, weights;
    std::vector<int32_t> experts;
  };
  void OnRouting(int layer, int64_t, int top_k, absl::Span<const float> logits,
                 absl::Span<const int32_t> experts, absl::Span<const float> weights) override {
    layers[layer] = Step{top_k,
                         {logits.begin(), logits.end()},
                         {weights.begin(), weights.end()},
                         {experts.begin(), experts.end()}};
  }
  std::map<int, Step> layers;
};

// The gap, in the reference's scores recomputed in double from its logits,
// between the last choice made and the best choice not made (experts, and
// groups for sigmoid scoring). Small gaps make the choice fragile.
double ChoiceMargin(const model::MoeConfig& m, const float* logits, const float* bias) {
  const int E = static_cast<int>(m.num_experts);
  std::vector<double> choice(E);
  double margin = INFINITY;
  auto gap_at = [](std::vector<double> v, int k) {
    std::sort(v.begin(), v.end(), std::greater<>());
    return k < static_cast<int>(v.size()) && std::isfinite(v[k]) ? v[k - 1] - v[k] : INFINITY;
  };
  if (m.scoring == model::MoeScoring::kSoftmax) {
    const double max = *std::max_element(logits, logits + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += choice[e] = std::exp(logits[e] - max);
    for (double& c : choice) c /= sum;
  } else {
    for (int e = 0; e < E; ++e) choice[e] = 1 / (1 + std::exp(-double{logits[e]})) + bias[e];
    const int G = static_cast<int>(m.n_group), size = E / G;
    std::vector<double> group(G);
    for (int g = 0; g < G; ++g) {
      std::vector<double> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
      std::sort(members.begin(), members.end(), std::greater<>());
      group[g] = members[0] + members[1];
    }
    margin = gap_at(group, static_cast<int>(m.topk_group));
    std::vector<int> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return group[a] > group[b]; });
    for (int j = static_cast<int>(m.topk_group); j < G; ++j) {
      for (int e = order[j] * size; e < (order[j] + 1) * size; ++e) choice[e] = -INFINITY;
    }
  }
  return std::min(margin, gap_at(choice, static_cast<int>(m.top_k)));
}

// (expert, weight) pairs of one token, sorted by expert.
std::vector<std::pair<int32_t, float>> Sorted(const int32_t* ids, const float* w, int k) {
  std::vector<std::pair<int32_t, float>> out;
  for (int j = 0; j < k; ++j) out.push_back({ids[j], w[j]});
  std::sort(out.begin(), out.end());
  return out;
}

class MoeRoutingParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeRoutingParityTest, EveryTokensExpertsAndWeightsMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << "missing fixture " << dir;
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(ss.str());
  auto model = model::LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& config = (*model)->config;
  const model::MoeConfig& moe = *config.moe;
  auto routing = model::SafetensorsFile::Open(dir + "/expected_routing.safetensors");
  ASSERT_TRUE(routing.ok()) << routing.status();
  auto load = [&](const std::string& name) {
    auto view = (*routing)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    return view.ok() ? *model::ToFloat32(*view) : std::vector<float>();
  };
  auto load_ids = [&](const std::string& name) {
    auto view = (*routing)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    std::vector<int32_t> ids;
    if (!view.ok() || view->dtype != model::DType::kI32) return ids;
    ids.resize(view->num_elements());
    std::memcpy(ids.data(), view->data, view->size_bytes);
    return ids;
  };

  Recorder recorder;
  CpuRunnerOptions options;
  options.num_kv_blocks = 32;
  options.routing_observer = &recorder;
  auto runner = CpuModelRunner::Create(model->get(), options);
  ASSERT_TRUE(runner.ok()) << runner.status();

  int64_t tokens_compared = 0, near_ties = 0;
  const auto& prompts = expected["prompts"];
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t> prompt = prompts[p].get<std::vector<int32_t>>();
    std::vector<int32_t> blocks(8);
    std::iota(blocks.begin(), blocks.end(), 0);
    ForwardBatch batch;
    batch.block_table_stride = 8;
    batch.AddSequence(prompt, 0, blocks, options.block_size, true);
    std::vector<float> logits;
    recorder.layers.clear();
    ASSERT_TRUE((*runner)->Forward(batch, &logits).ok());
    ASSERT_EQ(recorder.layers.size(), expected["moe_layers"].size());

    for (const int layer : expected["moe_layers"].get<std::vector<int>>()) {
      SCOPED_TRACE(absl::StrCat("prompt ", p, " layer ", layer));
      ASSERT_TRUE(recorder.layers.contains(layer));
      const Recorder::Step& got = recorder.layers[layer];
      const std::string key = absl::StrCat("routing_", p, "_", layer, "_");
      const std::vector<float> want_logits = load(key + "logits");
      const std::vector<int32_t> want_ids = load_ids(key + "experts");
      const std::vector<float> want_weights = load(key + "weights");
      ASSERT_EQ(got.logits.size(), want_logits.size());
      float logit_err = 0;
      for (size_t i = 0; i < got.logits.size(); ++i) {
        logit_err = std::max(logit_err, std::abs(got.logits[i] - want_logits[i]));
      }
      EXPECT_LE(logit_err, kLogitTolerance);

      std::vector<float> bias;
      if (moe.has_correction_bias()) {
        bias = *model::ToFloat32(*(*model)->weights.layers[layer].moe->correction_bias);
      }
      const int k = got.top_k;
      for (size_t t = 0; t < prompt.size(); ++t) {
        ASSERT_EQ(want_ids.size(), prompt.size() * k);
        auto want = Sorted(want_ids.data() + t * k, want_weights.data() + t * k, k);
        auto have = Sorted(got.experts.data() + t * k, got.weights.data() + t * k, k);
        ++tokens_compared;
        if (ChoiceMargin(moe, want_logits.data() + t * moe.num_experts, bias.data()) < kNearTie) {
          ++near_ties;
          continue;
        }
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(have[j].first, want[j].first) << "token " << t;
          EXPECT_NEAR(have[j].second, want[j].second, kWeightTolerance) << "token " << t;
        }
      }
    }
  }
  RecordProperty("tokens_compared", absl::StrCat(tokens_compared));
  RecordProperty("near_ties_skipped", absl::StrCat(near_ties));
  EXPECT_EQ(tokens_compared, 2 * (5 + 19 + 45));
  EXPECT_EQ(near_ties, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeRoutingParityTest,
                         ::testing::Values("qwen3_moe_tiny", "glm4_moe_tiny", "qwen3_moe_d64",
                                           "glm4_moe_d64"));

}  // namespace
}  // namespace tessera::runner
