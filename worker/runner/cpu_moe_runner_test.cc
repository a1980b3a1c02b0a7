// The CPU runner on mixture-of-experts models (random Qwen3-MoE and GLM-4.5
// checkpoints from test_model.h) in the edge cases of routing: every token
// to one expert, experts that receive no token, a batch of one token, and
// a batch with more tokens than experts. The optimized path (tokens grouped
// by expert) is checked against the reference path (token by token), and
// against a dense model where the routing makes the two equal.
//
// Tolerance: optimized vs reference logits within 1e-4 (fp32 vs
// double-accumulated GEMMs; logits are O(1-10)). Where the computation is
// the same arithmetic (a dense model equal to an always-chosen expert;
// batching), the test asks for bitwise equality.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/safetensors_writer.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

std::string TempDir() {
  std::string pattern = "/tmp/tessera-moe-runner-XXXXXX";
  char* dir = mkdtemp(pattern.data());
  return dir ? std::string(dir) : "/tmp";
}

constexpr float kTolerance = 1e-4f;

// Every expert id each sparse layer chose in the last steps.
class ChoiceRecorder : public MoeRoutingObserver {
 public:
  void OnRouting(int layer, int64_t, int, absl::Span<const float>,
                 absl::Span<const int32_t> experts, absl::Span<const float>) override {
    for (int32_t e : experts) chosen[layer].insert(e);
  }
  std::map<int, std::set<int32_t>> chosen;
};

TestModelSpec MoeSpec(const std::string& architecture) {
  TestModelSpec spec;
  spec.architecture = architecture;
  spec.layers = 3;
  if (architecture == "Glm4MoeForCausalLM") {
    spec.experts = 16;
    spec.top_k = 4;
    spec.groups = 4;
    spec.topk_groups = 2;
    spec.routed_scaling = 2.5;
    spec.first_dense_layers = 1;
  }
  return spec;
}

std::unique_ptr<model::LoadedModel> Load(const TestModelSpec& spec) {
  const std::string dir = TempDir();
  EXPECT_TRUE(WriteTestModel(dir, spec).ok());
  auto m = model::LoadModel(dir);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::unique_ptr<CpuModelRunner> MakeRunner(const model::LoadedModel* m, bool reference,
                                           MoeRoutingObserver* observer = nullptr) {
  CpuRunnerOptions o;
  o.block_size = 4;
  o.num_kv_blocks = 128;
  o.kernels = reference ? &kernels::ReferenceCpuKernels() : &kernels::OptimizedCpuKernels();
  o.routing_observer = observer;
  auto r = CpuModelRunner::Create(m, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
  return t;
}

std::vector<int32_t> Blocks(int first, int count) {
  std::vector<int32_t> b(count);
  std::iota(b.begin(), b.end(), first);
  return b;
}

// Logits of every position of each prompt, all prompts in one batch.
std::vector<float> Prefill(CpuModelRunner& r, const std::vector<std::vector<int32_t>>& prompts) {
  ForwardBatch b;
  b.block_table_stride = 32;
  int row = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    b.AddSequence(prompts[s], 0, Blocks(32 * static_cast<int>(s), 32), r.block_size(), false);
    for (size_t i = 0; i < prompts[s].size(); ++i) b.logits_indices.push_back(row++);
  }
  std::vector<float> logits;
  EXPECT_TRUE(r.Forward(b, &logits).ok());
  return logits;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

class CpuMoeRunnerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuMoeRunnerTest, BatchLargerThanTheExpertCountMatchesReferenceAndEachAlone) {
  auto m = Load(MoeSpec(GetParam()));
  ASSERT_NE(m, nullptr);
  auto fast = MakeRunner(m.get(), false);
  auto slow = MakeRunner(m.get(), true);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(45, 1), Prompt(31, 2), Prompt(24, 3)};
  ASSERT_GT(45 + 31 + 24, m->config.moe->num_experts);
  const std::vector<float> batched = Prefill(*fast, prompts);
  EXPECT_LT(MaxAbsDiff(batched, Prefill(*slow, prompts)), kTolerance);
  std::vector<float> alone;
  for (const auto& p : prompts) {
    std::vector<float> one = Prefill(*fast, {p});
    alone.insert(alone.end(), one.begin(), one.end());
  }
  EXPECT_EQ(batched, alone) << "a token's logits do not depend on its batch";
}

TEST_P(CpuMoeRunnerTest, BatchOfOneTokenLeavesMostExpertsWithoutAToken) {
  auto m = Load(MoeSpec(GetParam()));
  ASSERT_NE(m, nullptr);
  ChoiceRecorder recorder;
  auto fast = MakeRunner(m.get(), false, &recorder);
  auto slow = MakeRunner(m.get(), true);
  const std::vector<float> got = Prefill(*fast, {{42}});
  EXPECT_LT(MaxAbsDiff(got, Prefill(*slow, {{42}})), kTolerance);
  ASSERT_FALSE(recorder.chosen.empty());
  for (const auto& [layer, experts] : recorder.chosen) {
    EXPECT_EQ(experts.size(), static_cast<size_t>(m->config.moe->top_k)) << "layer " << layer;
  }

  // One decode token after a prefill gives the prefill's last logits.
  const std::vector<int32_t> prompt = Prompt(20, 4);
  const std::vector<float> full = Prefill(*fast, {prompt});
  ForwardBatch head, step;
  head.block_table_stride = step.block_table_stride = 32;
  head.AddSequence(std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 0, Blocks(64, 32), 4,
                   false);
  step.AddSequence({prompt.back()}, 19, Blocks(64, 32), 4, true);
  std::vector<float> unused, last;
  ASSERT_TRUE(fast->Forward(head, &unused).ok());
  ASSERT_TRUE(fast->Forward(step, &last).ok());
  EXPECT_EQ(last, std::vector<float>(full.end() - 256, full.end()));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuMoeRunnerTest,
                         ::testing::Values("Qwen3MoeForCausalLM", "Glm4MoeForCausalLM"),
                         [](const auto& info) { return info.param; });

// Replaces tensor `name`'s values with `value` everywhere.
void Fill(std::vector<model::TensorToWrite>* tensors, const std::string& name, float value,
          int64_t only_index = -1) {
  for (model::TensorToWrite& t : *tensors) {
    if (t.name != name) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(n, only_index < 0 ? value : 0.0f);
    if (only_index >= 0) v[only_index] = value;
    t = *model::MakeTensor(t.name, t.dtype, t.shape, v);
  }
}

// A zero router gives every expert the same score: with top-1 every token
// goes to expert 0 (the tie rule) with weight 1 (renormalised), so the MoE
// model equals a dense Qwen3 whose MLP is expert 0, bitwise.
TEST(CpuMoeEdgeCaseTest, EveryTokenToOneExpertEqualsADenseModelOfThatExpert) {
  TestModelSpec spec = MoeSpec("Qwen3MoeForCausalLM");
  spec.top_k = 1;
  spec.edit_tensors = [&](std::vector<model::TensorToWrite>* t) {
    for (int l = 0; l < spec.layers; ++l) {
      Fill(t, "model.layers." + std::to_string(l) + ".mlp.gate.weight", 0.0f);
    }
  };
  const std::string moe_dir = TempDir();
  ASSERT_TRUE(WriteTestModel(moe_dir, spec).ok());
  auto moe = model::LoadModel(moe_dir);
  ASSERT_TRUE(moe.ok()) << moe.status();

  // The dense twin: config of a Qwen3 with expert 0's width, and every
  // tensor copied with mlp.experts.0.* renamed to mlp.*.
  TestModelSpec dense_spec = spec;
  dense_spec.architecture = "Qwen3ForCausalLM";
  dense_spec.intermediate = spec.expert_intermediate;
  dense_spec.edit_tensors = nullptr;
  const std::string dense_dir = TempDir();
  ASSERT_TRUE(WriteTestModel(dense_dir, dense_spec).ok());
  std::vector<model::TensorToWrite> tensors;
  for (const std::string& name : (*moe)->checkpoint->TensorNames()) {
    std::string renamed = name;
    if (const size_t at = name.find("mlp.experts.0."); at != std::string::npos) {
      renamed = name.substr(0, at) + "mlp." + name.substr(at + 14);
    } else if (name.find(".mlp.") != std::string::npos) {
      continue;  // the router and the other experts
    }
    const model::TensorView* v = (*moe)->checkpoint->Find(name);
    tensors.push_back({renamed, v->dtype, v->shape,
                       std::string(reinterpret_cast<const char*>(v->data), v->size_bytes)});
  }
  ASSERT_TRUE(model::WriteSafetensorsFile(dense_dir + "/model.safetensors", tensors).ok());
  auto dense = model::LoadModel(dense_dir);
  ASSERT_TRUE(dense.ok()) << dense.status();

  ChoiceRecorder recorder;
  auto moe_runner = MakeRunner(moe->get(), false, &recorder);
  auto dense_runner = MakeRunner(dense->get(), false);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(40, 5), Prompt(9, 6)};
  EXPECT_EQ(Prefill(*moe_runner, prompts), Prefill(*dense_runner, prompts));
  for (const auto& [layer, experts] : recorder.chosen) {
    EXPECT_EQ(experts, std::set<int32_t>{0}) << "layer " << layer;
  }
}

// GLM-4.5 routing: a large correction bias on expert 13 makes every token
// choose it (and the rest of its top-4 from 13's group, which alone wins
// the group vote for every token), yet its weight comes from the unbiased
// score. Many experts get no token; the optimized path must agree with the
// reference.
TEST(CpuMoeEdgeCaseTest, GlmBiasSendsEveryTokenToOneExpert) {
  TestModelSpec spec = MoeSpec("Glm4MoeForCausalLM");
  spec.topk_groups = 1;
  spec.edit_tensors = [&](std::vector<model::TensorToWrite>* t) {
    for (int l = 0; l < spec.layers; ++l) {
      Fill(t, "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias", 10.0f, 13);
    }
  };
  auto m = Load(spec);
  ASSERT_NE(m, nullptr);
  ChoiceRecorder recorder;
  auto fast = MakeRunner(m.get(), false, &recorder);
  auto slow = MakeRunner(m.get(), true);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(33, 7), Prompt(12, 8)};
  EXPECT_LT(MaxAbsDiff(Prefill(*fast, prompts), Prefill(*slow, prompts)), kTolerance);
  ASSERT_EQ(recorder.chosen.size(), 2u);  // layers 1 and 2; layer 0 is dense
  for (const auto& [layer, experts] : recorder.chosen) {
    EXPECT_EQ(experts, (std::set<int32_t>{12, 13, 14, 15})) << "layer " << layer;
  }
}

}  // namespace
}  // namespace tessera::runner
