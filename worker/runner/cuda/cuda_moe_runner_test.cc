// The CUDA runner on mixture-of-experts models (GPU; skipped without one,
// except the host cases on the weight layouts): Qwen3-MoE (softmax top-2 of
// 8 experts, a dense first layer) and GLM-4.5 (sigmoid scores with a
// correction bias, 4 groups of which 2 are kept, top-4 of 16, a shared
// expert, scaling 2.5, q/k/v bias, q/k norms, partial RoPE 0.5, a dense
// first layer; and with its q/k norms off, so q/k rows are also in the
// GEMV RoPE order), head_dim 64, against the CPU runner, whose MoE logits match
// transformers on the tiny fixtures within 1e-4 (fixture_parity_test).
//
// The tiny fixtures themselves (tests/fixtures/models/*_moe_tiny) have
// head_dim 32, which the CUDA attention kernels do not run (64, 128, 256):
// the runner refuses them with an error naming head_dim, tested here.
//
// Steps, each run on both runners: a batch of one token; a prefill of 65
// tokens over 3 sequences (more tokens than experts, so every path groups;
// with top-2 of 8 or top-4 of 16 single-token steps leave most experts
// without a token); decode steps of 3; a chunk after context beside
// decodes. Tolerances (bf16 weights and activations on the GPU, the CPU in
// fp32 from the same weights):
//   - routers of zeros: every token routes alike on both (equal scores: the
//     lower expert wins; GLM: the correction bias chooses), so every logits
//     row must be within 4% of its scale (as the dense tests);
//   - random routers: a token whose k-th and (k+1)-th router scores are
//     closer than the bf16 error may pick another expert on the GPU and
//     then (legitimately) get other logits. So: the mean error over all
//     rows <= 1% of the scale, at least 90% of rows within 4%, and the
//     argmax equal on at least 90% of rows whose CPU top-2 margin exceeds
//     twice their error bound. A wrong expert, weight, shared expert or
//     rotation moves nearly every row and fails all three.
//   - CUDA graphs against eager steps on the same GPU: within 1e-3 of the
//     scale, the same argmax on every row.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda_devices.h"
#include "nlohmann/json.hpp"
#include "worker/model/weights.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#include "worker/runner/cuda/cuda_weights.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

#define REQUIRE_GPU(device)                                                            \
  kernels::DetectedCudaDevices detected_ = kernels::DetectCudaDevices();               \
  if (detected_.devices.empty()) GTEST_SKIP() << "no CUDA device: " << detected_.note; \
  const kernels::DeviceDescription device = detected_.devices.front()

std::string SourcePath(const std::string& rel) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/", rel);
}

TestModelSpec MoeSpec(const std::string& arch, bool zero_routers) {
  TestModelSpec s;
  s.architecture = arch;
  s.vocab = 384;
  s.hidden = 128;
  s.intermediate = 160;
  s.layers = 3;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.first_dense_layers = 1;
  s.expert_intermediate = 32;
  if (arch == "Glm4MoeForCausalLM") {
    s.experts = 16;
    s.top_k = 4;
    s.groups = 4;
    s.topk_groups = 2;
    s.shared_experts = 1;
    s.routed_scaling = 2.5;
  }
  if (zero_routers) {
    s.edit_tensors = [](std::vector<model::TensorToWrite>* tensors) {
      for (model::TensorToWrite& t : *tensors) {
        if (absl::EndsWith(t.name, "mlp.gate.weight")) std::fill(t.bytes.begin(), t.bytes.end(), 0);
      }
    };
  }
  return s;
}

// A model written to a temporary directory that goes with the object;
// `qk_norm` false turns GLM-4.5's q/k norms off in its config (as the
// released GLM-4.5 checkpoints have them), leaving the norm tensors unused.
struct TempModel {
  explicit TempModel(const TestModelSpec& spec, bool qk_norm = true) {
    char tmpl[] = "/tmp/tessera-cuda-moe-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      model = absl::InternalError("mkdtemp failed");
      return;
    }
    dir = tmpl;
    absl::Status written = WriteTestModel(dir, spec);
    if (written.ok() && !qk_norm) written = TurnQkNormOff(dir + "/config.json");
    model = written.ok() ? model::LoadModel(dir) : written;
  }
  static absl::Status TurnQkNormOff(const std::string& path) {
    std::ifstream in(path);
    nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return absl::InternalError(absl::StrCat("cannot parse ", path));
    config["use_qk_norm"] = false;
    std::ofstream out(path);
    out << config.dump(1);
    return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
  }
  ~TempModel() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  std::string dir;
  absl::StatusOr<std::unique_ptr<model::LoadedModel>> model = absl::UnknownError("not loaded");
};

CudaRunnerOptions GpuOptions(bool graphs) {
  CudaRunnerOptions o;
  o.num_kv_blocks = 32;
  o.max_num_tokens = 128;
  o.max_num_seqs = 8;
  o.cuda_graphs = graphs;
  return o;
}

// The steps every test runs: per step, the new tokens of each of the 4
// sequences (0 = not in the step). Prefill chunks want every row's logits.
const std::vector<std::vector<int>>& Steps() {
  static const std::vector<std::vector<int>> steps = {
      {0, 0, 0, 1},    // a batch of one token
      {24, 1, 40, 0},  // 65 tokens
      {1, 1, 1, 0},   {1, 1, 1, 1},
      {1, 1, 1, 0},   {1, 9, 1, 0},  // a chunk after context beside decodes
      {1, 1, 1, 1},
  };
  return steps;
}

// Each step's logits rows, one vector per step.
using StepLogits = std::vector<std::vector<float>>;

absl::StatusOr<StepLogits> RunSteps(ModelRunner& runner, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  // Sequence s: blocks 4s + 3, .., 4s (an out-of-order table of 64 slots).
  const std::vector<std::vector<int32_t>> tables = {
      {3, 2, 1, 0}, {7, 6, 5, 4}, {11, 10, 9, 8}, {15, 14, 13, 12}};
  std::vector<int32_t> lens(tables.size(), 0);
  StepLogits out;
  for (const std::vector<int>& step : Steps()) {
    ForwardBatch b;
    b.block_table_stride = 4;
    for (size_t s = 0; s < tables.size(); ++s) {
      if (step[s] == 0) continue;
      std::vector<int32_t> tokens(step[s]);
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
      const int first_row = b.num_tokens();
      b.AddSequence(tokens, lens[s], tables[s], 16, /*want_logits=*/false);
      for (int i = 0; i < step[s]; ++i) b.logits_indices.push_back(first_row + i);
      lens[s] += step[s];
    }
    std::vector<float> logits;
    if (absl::Status st = runner.Forward(b, &logits); !st.ok()) return st;
    out.push_back(std::move(logits));
  }
  return out;
}

struct RowStats {
  int rows = 0, within = 0;               // rows, and rows within 4% of their scale
  int argmax_rows = 0, argmax_equal = 0;  // clear-margin rows, and their argmax agreeing
  double mean_error_over_scale = 0;
  float worst = 0;  // max error / scale
};

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

RowStats CompareRows(const StepLogits& got, const StepLogits& want, int64_t vocab) {
  RowStats st;
  double sum = 0;
  for (size_t step = 0; step < want.size(); ++step) {
    for (size_t r = 0; r * vocab < want[step].size(); ++r) {
      const float* w = want[step].data() + r * vocab;
      const float* g = got[step].data() + r * vocab;
      float scale = 1, err = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        scale = std::max(scale, std::abs(w[i]));
        err = std::max(err, std::abs(g[i] - w[i]));
      }
      ++st.rows;
      st.within += err <= 0.04f * scale;
      sum += err / scale;
      st.worst = std::max(st.worst, err / scale);
      std::vector<float> top(w, w + vocab);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
      if (top[0] - top[1] > 2 * 0.04f * scale) {
        ++st.argmax_rows;
        st.argmax_equal += Argmax(g, vocab) == Argmax(w, vocab);
      }
    }
  }
  st.mean_error_over_scale = sum / std::max(1, st.rows);
  return st;
}

struct MoeCase {
  const char* arch;
  bool zero_routers;
  // GLM-4.5 without q/k norms: q/k rows in RoPE order on top of the
  // partial-RoPE order (the qkv GEMV and decode attention rotate).
  bool qk_norm = true;
};

class MoeOnGpu : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeOnGpu, MatchesTheCpuRunnerEagerAndGraphed) {
  REQUIRE_GPU(device);
  const MoeCase param = GetParam();
  TempModel tm(MoeSpec(param.arch, param.zero_routers), param.qk_norm);
  ASSERT_TRUE(tm.model.ok()) << tm.model.status();
  const model::LoadedModel& model = **tm.model;
  ASSERT_TRUE(model.config.moe.has_value());
  ASSERT_EQ(model.config.qk_norm, param.qk_norm);
  const int64_t vocab = model.config.vocab_size;
  CpuRunnerOptions cpu_options;
  cpu_options.num_kv_blocks = 32;
  auto cpu = CpuModelRunner::Create(&model, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<StepLogits> want = RunSteps(**cpu, vocab, 5);
  ASSERT_TRUE(want.ok()) << want.status();

  StepLogits by_mode[2];
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "cuda graphs" : "eager");
    auto gpu = CudaModelRunner::Create(&model, device, GpuOptions(graphs));
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    absl::StatusOr<StepLogits> got = RunSteps(**gpu, vocab, 5);
    ASSERT_TRUE(got.ok()) << got.status();
    if (graphs) {
      EXPECT_GE((*gpu)->graphs_captured(), 2);  // batch buckets 1 and 4
    }
    const RowStats st = CompareRows(*got, *want, vocab);
    RecordProperty(absl::StrCat(graphs ? "graphs" : "eager", "_worst_error_over_scale"),
                   absl::StrCat(st.worst));
    if (param.zero_routers) {
      EXPECT_EQ(st.within, st.rows) << "worst error " << st.worst << " of the scale";
    } else {
      EXPECT_LE(st.mean_error_over_scale, 0.01);
      EXPECT_GE(10 * st.within, 9 * st.rows) << st.within << " of " << st.rows << " rows";
      EXPECT_GE(10 * st.argmax_equal, 9 * st.argmax_rows)
          << st.argmax_equal << " of " << st.argmax_rows << " clear-margin rows";
    }
    by_mode[graphs] = std::move(*got);
  }
  // Graphed decode steps against eager ones (padded rows, other kernels'
  // buckets): the same numbers.
  for (size_t step = 0; step < Steps().size(); ++step) {
    ASSERT_EQ(by_mode[0][step].size(), by_mode[1][step].size());
    for (size_t r = 0; r * vocab < by_mode[0][step].size(); ++r) {
      const float* e = by_mode[0][step].data() + r * vocab;
      const float* g = by_mode[1][step].data() + r * vocab;
      float scale = 1, err = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        scale = std::max(scale, std::abs(e[i]));
        err = std::max(err, std::abs(g[i] - e[i]));
      }
      EXPECT_LE(err, 1e-3f * scale) << "step " << step << " row " << r;
      EXPECT_EQ(Argmax(g, vocab), Argmax(e, vocab)) << "step " << step << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Moe, MoeOnGpu,
    ::testing::Values(MoeCase{"Qwen3MoeForCausalLM", false}, MoeCase{"Qwen3MoeForCausalLM", true},
                      MoeCase{"Glm4MoeForCausalLM", false}, MoeCase{"Glm4MoeForCausalLM", true},
                      MoeCase{"Glm4MoeForCausalLM", false, false},
                      MoeCase{"Glm4MoeForCausalLM", true, false}),
    [](const ::testing::TestParamInfo<MoeCase>& info) {
      return absl::StrCat(absl::StartsWith(info.param.arch, "Glm") ? "Glm4Moe" : "Qwen3Moe",
                          info.param.zero_routers ? "ZeroRouters" : "",
                          info.param.qk_norm ? "" : "NoQkNorm");
    });

TEST(CudaMoeRunnerTest, TinyFixturesAreRefusedForTheirHeadDim) {
  REQUIRE_GPU(device);
  for (const char* name : {"qwen3_moe_tiny", "glm4_moe_tiny"}) {
    SCOPED_TRACE(name);
    auto model = model::LoadModel(SourcePath(absl::StrCat("tests/fixtures/models/", name)));
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->config.head_dim, 32);
    auto gpu = CudaModelRunner::Create(model->get(), device, GpuOptions(true));
    ASSERT_FALSE(gpu.ok());
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(gpu.status().message(), "head_dim")) << gpu.status();
  }
}

// Host case: the harness on the CPU runner. Every step runs and gives one
// finite logits row per token; with routers of zeros every token of every
// sparse layer takes the same experts (Qwen3-MoE: 0 and 1, equal scores
// going to the lower index), which is what lets the GPU comparison above
// hold every row to the dense tolerance.
class SameExpertsObserver : public MoeRoutingObserver {
 public:
  void OnRouting(int layer, int64_t num_tokens, int top_k, absl::Span<const float> router_logits,
                 absl::Span<const int32_t> experts, absl::Span<const float> weights) override {
    for (int64_t t = 0; t < num_tokens; ++t) {
      ++tokens;
      for (int j = 0; j < top_k; ++j) different += experts[t * top_k + j] != j;
    }
  }
  int64_t tokens = 0, different = 0;
};

TEST(CudaMoeHarnessTest, StepsRunOnTheCpuRunnerAndZeroRoutersRouteAlike) {
  TempModel tm(MoeSpec("Qwen3MoeForCausalLM", true));
  ASSERT_TRUE(tm.model.ok()) << tm.model.status();
  SameExpertsObserver observer;
  CpuRunnerOptions options;
  options.num_kv_blocks = 32;
  options.routing_observer = &observer;
  auto cpu = CpuModelRunner::Create(tm.model->get(), options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t vocab = (*tm.model)->config.vocab_size;
  absl::StatusOr<StepLogits> logits = RunSteps(**cpu, vocab, 5);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), Steps().size());
  int64_t rows = 0;
  for (size_t step = 0; step < Steps().size(); ++step) {
    const std::vector<int>& lens = Steps()[step];
    const int tokens = std::accumulate(lens.begin(), lens.end(), 0);
    EXPECT_EQ((*logits)[step].size(), static_cast<size_t>(tokens * vocab)) << "step " << step;
    for (float x : (*logits)[step]) ASSERT_TRUE(std::isfinite(x)) << "step " << step;
    rows += tokens;
  }
  EXPECT_EQ(observer.tokens, 2 * rows);  // two sparse layers
  EXPECT_EQ(observer.different, 0);
}

// Host case: the GLM-4.5 model with its q/k norms turned off loads (the
// norm tensors unused) and runs the steps on the CPU runner.
TEST(CudaMoeHarnessTest, GlmWithoutQkNormRunsOnTheCpuRunner) {
  TempModel tm(MoeSpec("Glm4MoeForCausalLM", false), /*qk_norm=*/false);
  ASSERT_TRUE(tm.model.ok()) << tm.model.status();
  EXPECT_FALSE((*tm.model)->config.qk_norm);
  EXPECT_EQ((*tm.model)->config.rotary_dim(), 32);
  CpuRunnerOptions options;
  options.num_kv_blocks = 32;
  auto cpu = CpuModelRunner::Create(tm.model->get(), options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<StepLogits> logits = RunSteps(**cpu, (*tm.model)->config.vocab_size, 5);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->size(), Steps().size());
}

// Host cases: the weight layouts, no GPU needed.
TEST(CudaMoeLayoutTest, PartialRotaryOrderPutsTheModelsPairsWhereTheKernelsRotate) {
  for (const auto [D, R] :
       {std::pair{64, 32}, std::pair{128, 64}, std::pair{64, 16}, std::pair{128, 128}}) {
    SCOPED_TRACE(absl::StrCat("head_dim ", D, " rotary ", R));
    const std::vector<int64_t> order = PartialRotaryOrder(D, R);
    ASSERT_EQ(static_cast<int>(order.size()), D);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> identity(D);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity);  // a permutation
    for (int i = 0; i < R / 2; ++i) {
      // The kernels' pair (i, i + D/2) is the model's (i, i + R/2).
      EXPECT_EQ(order[i], i);
      EXPECT_EQ(order[D / 2 + i], R / 2 + i);
    }
    for (int i = R / 2; i < D / 2; ++i) {
      // Pairs at angle 0 (inv_freq padded with zeros) hold pass-through dims.
      EXPECT_GE(order[i], R);
      EXPECT_GE(order[D / 2 + i], R);
    }
  }
}

// rotate_half over the first `rotary` dims of x by angles pos * inv_freq
// (pairs (i, i + rotary / 2)), as transformers and the CPU runner do; the
// GPU kernels are this with rotary = x.size().
std::vector<float> RotateHalf(std::vector<float> x, int rotary, const std::vector<float>& inv_freq,
                              float pos) {
  for (int i = 0; i < rotary / 2; ++i) {
    const float a = pos * inv_freq[i], c = std::cos(a), s = std::sin(a);
    const float x1 = x[i], x2 = x[i + rotary / 2];
    x[i] = x1 * c - x2 * s;
    x[i + rotary / 2] = x2 * c + x1 * s;
  }
  return x;
}

// The whole-head rotation of a head stored in PartialRotaryOrder, with the
// frequencies padded with zeros, is the model's partial rotation of that
// head, stored in the same order: bit for bit.
TEST(CudaMoeLayoutTest, WholeHeadRopeOnPermutedRowsIsPartialRope) {
  const int D = 64, R = 32;
  std::vector<float> inv_freq(R / 2), padded(D / 2, 0.0f);
  for (int i = 0; i < R / 2; ++i) {
    inv_freq[i] = padded[i] = 1.0f / std::pow(10000.0f, 2.0f * i / R);
  }
  const std::vector<int64_t> order = PartialRotaryOrder(D, R);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const float pos : {0.0f, 1.0f, 17.0f, 1000.0f}) {
    std::vector<float> head(D), stored(D);
    for (float& x : head) x = normal(rng);
    for (int i = 0; i < D; ++i) stored[i] = head[order[i]];
    const std::vector<float> model = RotateHalf(head, R, inv_freq, pos);
    const std::vector<float> gpu = RotateHalf(stored, D, padded, pos);
    for (int i = 0; i < D; ++i) {
      EXPECT_EQ(gpu[i], model[order[i]]) << "position " << pos << " row " << i;
    }
  }
}

TEST(CudaMoeLayoutTest, DenseMlpWidthCoversDenseLayersAndSharedExperts) {
  TempModel qwen(MoeSpec("Qwen3MoeForCausalLM", false));
  ASSERT_TRUE(qwen.model.ok()) << qwen.model.status();
  const model::ModelConfig& q = (*qwen.model)->config;
  EXPECT_EQ(DenseMlpWidth(q, parallel::FullPlan(q)), 160);  // the dense first layer
  TempModel glm(MoeSpec("Glm4MoeForCausalLM", false));
  ASSERT_TRUE(glm.model.ok()) << glm.model.status();
  const model::ModelConfig& g = (*glm.model)->config;
  EXPECT_EQ(g.rotary_dim(), 32);
  EXPECT_EQ(DenseMlpWidth(g, parallel::FullPlan(g)), 160);
  // Every layer sparse, no shared experts: no dense buffers at all.
  TestModelSpec all_sparse = MoeSpec("Qwen3MoeForCausalLM", false);
  all_sparse.first_dense_layers = 0;
  TempModel sparse(all_sparse);
  ASSERT_TRUE(sparse.model.ok()) << sparse.model.status();
  const model::ModelConfig& s = (*sparse.model)->config;
  EXPECT_EQ(DenseMlpWidth(s, parallel::FullPlan(s)), 0);
}

}  // namespace
}  // namespace tessera::runner
