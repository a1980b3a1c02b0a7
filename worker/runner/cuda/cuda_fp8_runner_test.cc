// The CUDA runner on FP8 checkpoints against the CPU runner on the same
// checkpoints (kernels/cpu/fp8_linear.h, the reference arithmetic), for
// small random models quantized here: the fine-grained block format and
// compressed-tensors per tensor, per channel and per block, with dynamic
// per-group, dynamic per-token, static and no activation quantization;
// prefill (37 tokens: cuBLASLt's 32 rows + the GEMV's 5, or the dequantize
// path) and decode, eager and as CUDA graphs. Then the on-disk fixtures of
// tests/gpu/make_fp8_fixtures.py when present (else skipped, naming it).
//
// Shapes: hidden 320 (2.5 scale blocks: a partial block along K and along
// the o/down rows), 4 heads / 2 KV heads of 64 (q/k/v rows 256/128/128
// stack into one part), intermediate 384 (gate/up one part).
//
// Tolerances. The GPU keeps activations in bf16 (the CPU in fp32), so an
// activation near an e4m3 rounding boundary may round to the neighbouring
// e4m3 value on one side (a 1/8 relative step of that element; about 1 in
// 64 elements, bf16's 2^-9 against e4m3's 2^-3 spacing); the dequantize
// path adds one bf16 rounding of each weight. Hence, per logits row, with
// scale = max(1, max |cpu|):
//   mean |gpu - cpu| <= 1e-2 * scale   (bf16's 0.4e-2 of the bf16 tests, plus flips)
//   max  |gpu - cpu| <= 1e-1 * scale
// Greedy continuations (8 tokens, each runner fed its own tokens) equal
// until the first difference, accepted only where the CPU's top-1 minus
// top-2 logit is below kNearTie = 0.1 * scale (above the max error: such a
// flip is not a near tie), and compared no further.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cuda/device_query.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/cuda/cuda_runner_test_util.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

using Json = nlohmann::json;
namespace kc = ::tessera::kernels::cpu;

constexpr float kMeanRel = 1e-2f;
constexpr float kMaxRel = 1e-1f;
constexpr float kNearTieRel = 1e-1f;
constexpr int kPromptLen = 37;
constexpr int kGreedySteps = 8;

std::string TempDir() {
  char tmpl[] = "/tmp/tessera-cuda-fp8-XXXXXX";
  return mkdtemp(tmpl) == nullptr ? std::string() : std::string(tmpl);
}

bool IsLinear(const std::string& name) { return name.find("_proj.weight") != std::string::npos; }

// The weight format of one test case.
struct Format {
  std::string name;
  Json quant;
  std::string strategy;  // block, channel, tensor
  bool static_input = false;
};

Format Ct(const std::string& strategy, const std::string& acts) {
  Json weights = {{"num_bits", 8},
                  {"type", "float"},
                  {"symmetric", true},
                  {"dynamic", false},
                  {"strategy", strategy}};
  if (strategy == "block") weights["block_structure"] = {128, 128};
  Json group = {{"targets", {"Linear"}}, {"weights", weights}};
  if (acts == "none") {
    group["input_activations"] = nullptr;
  } else if (acts == "token") {
    group["input_activations"] = {{"num_bits", 8},
                                  {"type", "float"},
                                  {"symmetric", true},
                                  {"dynamic", true},
                                  {"strategy", "token"}};
  } else if (acts == "group") {
    group["input_activations"] = {{"num_bits", 8},   {"type", "float"},     {"symmetric", true},
                                  {"dynamic", true}, {"strategy", "group"}, {"group_size", 128}};
  } else {
    group["input_activations"] = {{"num_bits", 8},
                                  {"type", "float"},
                                  {"symmetric", true},
                                  {"dynamic", false},
                                  {"strategy", "tensor"}};
  }
  Json q = {{"quant_method", "compressed-tensors"},
            {"format", "float-quantized"},
            {"config_groups", {{"group_0", group}}},
            {"ignore", {"lm_head"}}};
  return {absl::StrCat("ct_", strategy, "_", acts), q, strategy, acts == "static"};
}

Format FineGrained() {
  return {"fp8_block",
          Json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]})"),
          "block", false};
}

// Writes an FP8 copy of `dir`'s fp32 model in format `f` to `out`.
void Quantize(const std::string& dir, const Format& f, const std::string& out) {
  auto file = model::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<model::TensorToWrite> tensors;
  int linear = 0;
  for (const model::TensorView& t : (*file)->tensors()) {
    auto values = model::ToFloat32(t);
    ASSERT_TRUE(values.ok());
    if (!IsLinear(t.name)) {
      tensors.push_back(*model::MakeTensor(t.name, model::DType::kF32, t.shape, *values));
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const bool block = f.strategy == "block";
    const int64_t br = block ? (rows + 127) / 128 : f.strategy == "channel" ? rows : 1;
    const int64_t bc = block ? (cols + 127) / 128 : 1;
    auto cell = [&](int64_t o, int64_t i) {
      return block ? (o / 128) * bc + i / 128 : f.strategy == "channel" ? o : 0;
    };
    std::vector<float> grid(br * bc, 0.f), q(rows * cols);
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        float& g = grid[cell(o, i)];
        g = std::max(g, std::abs((*values)[o * cols + i]) / kc::kE4m3Max);
      }
    }
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        q[o * cols + i] = std::clamp((*values)[o * cols + i] / grid[cell(o, i)], -448.f, 448.f);
      }
    }
    const std::string module = t.name.substr(0, t.name.size() - 7);
    const std::string suffix =
        f.quant["quant_method"] == "fp8" ? ".weight_scale_inv" : ".weight_scale";
    std::vector<int64_t> scale_shape = block                     ? std::vector<int64_t>{br, bc}
                                       : f.strategy == "channel" ? std::vector<int64_t>{br, 1}
                                                                 : std::vector<int64_t>{1};
    tensors.push_back(*model::MakeTensor(t.name, model::DType::kF8E4M3, t.shape, q));
    tensors.push_back(*model::MakeTensor(module + suffix, model::DType::kF32, scale_shape, grid));
    if (f.static_input) {
      // Different scales per module (q, k and v then stay separate parts).
      const float s = 0.004f * (1.f + 0.25f * static_cast<float>(linear % 3));
      tensors.push_back(*model::MakeTensor(module + ".input_scale", model::DType::kF32, {1}, {s}));
    }
    ++linear;
  }
  std::ifstream in(dir + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  Json config = Json::parse(ss.str());
  config["quantization_config"] = f.quant;
  ASSERT_TRUE(model::WriteBinaryFile(out + "/config.json", config.dump()).ok());
  ASSERT_TRUE(model::WriteSafetensorsFile(out + "/model.safetensors", tensors).ok());
}

struct Err {
  float scale = 1, max = 0, mean = 0;
};

Err Compare(const float* got, const float* want, int64_t n) {
  Err e;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    e.scale = std::max(e.scale, std::abs(want[i]));
    e.max = std::max(e.max, std::abs(got[i] - want[i]));
    sum += std::abs(got[i] - want[i]);
  }
  e.mean = static_cast<float>(sum / std::max<int64_t>(1, n));
  return e;
}

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

float Margin(const float* row, int64_t n) {
  std::vector<float> v(row, row + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return v[0] - v[1];
}

std::vector<int32_t> Prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < kPromptLen; ++i) p.push_back((i * 53 + 11) % 250);
  return p;
}

// Logits of every prompt position, then of kGreedySteps greedy steps (each
// fed the runner's own argmax): rows of `vocab`, and the tokens.
struct RunResult {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};

RunResult RunGreedy(ModelRunner& runner, int block_size, int64_t vocab) {
  RunResult r;
  const std::vector<int32_t> prompt = Prompt();
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  ForwardBatch batch;
  batch.block_table_stride = 4;
  batch.AddSequence(prompt, 0, blocks, block_size, false);
  for (int i = 0; i < kPromptLen; ++i) batch.logits_indices.push_back(i);
  std::vector<float> logits;
  const absl::Status s = runner.Forward(batch, &logits);
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return r;
  r.logits = logits;
  int32_t next = Argmax(logits.data() + (kPromptLen - 1) * vocab, vocab);
  for (int step = 0; step < kGreedySteps; ++step) {
    r.tokens.push_back(next);
    ForwardBatch decode;
    decode.block_table_stride = 4;
    decode.AddSequence({next}, kPromptLen + step, blocks, block_size, true);
    const absl::Status d = runner.Forward(decode, &logits);
    EXPECT_TRUE(d.ok()) << d;
    if (!d.ok()) return r;
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
    next = Argmax(logits.data(), vocab);
  }
  return r;
}

// Greedy tokens equal up to the first difference, which must be at a near
// tie of the CPU's; logits rows within the tolerances up to there (later
// rows saw other tokens).
void ExpectParity(const RunResult& gpu, const RunResult& cpu, int64_t vocab,
                  const std::string& what) {
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size()) << what;
  ASSERT_EQ(gpu.tokens.size(), cpu.tokens.size()) << what;
  int64_t rows = static_cast<int64_t>(cpu.logits.size()) / vocab;
  for (int step = 0; step < static_cast<int>(gpu.tokens.size()); ++step) {
    if (gpu.tokens[step] == cpu.tokens[step]) continue;
    // The token of step s is the argmax of logits row kPromptLen - 1 + s.
    const float* row = cpu.logits.data() + (kPromptLen - 1 + step) * vocab;
    const Err e = Compare(row, row, vocab);
    EXPECT_LT(Margin(row, vocab), kNearTieRel * e.scale)
        << what << ": greedy step " << step << " differs (" << gpu.tokens[step] << " vs "
        << cpu.tokens[step] << ") at no near tie";
    rows = kPromptLen + step;
    break;
  }
  float worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const Err e = Compare(gpu.logits.data() + r * vocab, cpu.logits.data() + r * vocab, vocab);
    EXPECT_LE(e.mean, kMeanRel * e.scale) << what << " row " << r << " max " << e.max;
    EXPECT_LE(e.max, kMaxRel * e.scale) << what << " row " << r << " mean " << e.mean;
    worst = std::max(worst, e.max / e.scale);
  }
  ::testing::Test::RecordProperty(absl::StrCat(what, "_max_rel_err"), std::to_string(worst));
}

struct Case {
  Format format;
  const char* arch;
};

class CudaFp8RunnerTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFp8RunnerTest, MatchesTheCpuRunnerEagerAndGraphed) {
  REQUIRE_GPU(device);
  const Case& c = GetParam();
  const std::string base = TempDir(), fp8 = TempDir();
  ASSERT_FALSE(base.empty() || fp8.empty());
  TestModelSpec spec;
  spec.architecture = c.arch;
  spec.hidden = 320;
  spec.intermediate = 384;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  ASSERT_TRUE(WriteTestModel(base, spec).ok());
  Quantize(base, c.format, fp8);
  auto model = model::LoadModel(fp8);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::LoadedModel* m = model->get();
  const int64_t vocab = m->config.vocab_size;

  CpuRunnerOptions cpu_options;
  cpu_options.num_kv_blocks = 8;
  auto cpu = CpuModelRunner::Create(m, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const RunResult want = RunGreedy(**cpu, cpu_options.block_size, vocab);

  for (CudaFp8Prefill prefill : {CudaFp8Prefill::kCublasLtBlock, CudaFp8Prefill::kDequantize}) {
    if (prefill == CudaFp8Prefill::kCublasLtBlock && device.gpu && device.gpu->arch.major != 9) {
      continue;  // cuBLASLt's block mode is Hopper-only
    }
    for (bool graphs : {false, true}) {
      CudaRunnerOptions options = TestOptions(16, 64);
      options.cuda_graphs = graphs;
      CudaFp8UploadOptions upload;
      upload.prefill = prefill;
      std::string plan;
      auto gpu = CudaModelRunner::Create(
          m->config,
          [&](const model::ModelConfig&, const parallel::ShardPlan& p) {
            absl::StatusOr<CudaWeights> w = UploadWeights(*m, p, upload);
            if (w.ok()) plan = w->fp8_plan;
            return w;
          },
          device, options);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      // cuBLASLt takes the block-scaled, group-quantized, biasless parts
      // with K in whole blocks (o_proj: 256, down: 384), the rest dequantize.
      const bool lt = prefill == CudaFp8Prefill::kCublasLtBlock && c.format.strategy == "block" &&
                      (c.format.name == "fp8_block" || c.format.name == "ct_block_group");
      EXPECT_EQ(plan.find("prefill: 0 parts cublaslt") == std::string::npos, lt) << plan;
      EXPECT_NE(plan.find("off for FP8"), std::string::npos) << plan;
      const std::string what =
          absl::StrCat(c.format.name, "_", c.arch, "_", std::string(CudaFp8PrefillName(prefill)),
                       graphs ? "_graphs" : "");
      ExpectParity(RunGreedy(**gpu, options.block_size, vocab), want, vocab, what);
    }
  }
  std::filesystem::remove_all(base);
  std::filesystem::remove_all(fp8);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaFp8RunnerTest,
    ::testing::Values(Case{FineGrained(), "LlamaForCausalLM"},
                      Case{FineGrained(), "Qwen3ForCausalLM"},
                      Case{FineGrained(), "Qwen2ForCausalLM"},  // q/k/v bias: dequantized prefill
                      Case{Ct("block", "group"), "LlamaForCausalLM"},
                      Case{Ct("block", "token"), "LlamaForCausalLM"},
                      Case{Ct("channel", "token"), "Qwen3ForCausalLM"},
                      Case{Ct("tensor", "static"), "LlamaForCausalLM"},
                      Case{Ct("channel", "none"), "LlamaForCausalLM"},
                      Case{Ct("block", "none"), "Qwen3ForCausalLM"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string arch = info.param.arch;
      return absl::StrCat(info.param.format.name, "_", arch.substr(0, arch.find("For")));
    });

// Host side of the cases above (runs without a GPU): every format's model
// loads, the CUDA runner's checks accept it, and the CPU runner decodes it.
TEST(CudaFp8RunnerHostTest, EveryCaseModelLoadsAndRunsOnTheCpu) {
  for (const Format& f : {FineGrained(), Ct("block", "group"), Ct("block", "token"),
                          Ct("channel", "token"), Ct("tensor", "static"), Ct("channel", "none")}) {
    const std::string base = TempDir(), fp8 = TempDir();
    TestModelSpec spec;
    spec.architecture = "LlamaForCausalLM";
    spec.hidden = 320;
    spec.intermediate = 384;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 64;
    ASSERT_TRUE(WriteTestModel(base, spec).ok());
    Quantize(base, f, fp8);
    auto model = model::LoadModel(fp8);
    ASSERT_TRUE(model.ok()) << f.name << ": " << model.status();
    const model::LoadedModel* m = model->get();
    EXPECT_TRUE(CheckCudaFp8Support(m->config, parallel::FullPlan(m->config)).ok()) << f.name;
    CpuRunnerOptions options;
    options.num_kv_blocks = 8;
    auto cpu = CpuModelRunner::Create(m, options);
    ASSERT_TRUE(cpu.ok()) << f.name << ": " << cpu.status();
    const RunResult r = RunGreedy(**cpu, options.block_size, m->config.vocab_size);
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kGreedySteps)) << f.name;
    std::filesystem::remove_all(base);
    std::filesystem::remove_all(fp8);
  }
}

// Two ranks' plans slice FP8 weights at 128-row boundaries: each rank's
// upload holds its rows' bytes and scale blocks (the plan's bounds checked),
// and both ranks' qkv parts together have the full model's rows.
TEST(CudaFp8WeightsTest, TensorParallelSlicesHoldTheirRowsAndScales) {
  REQUIRE_GPU(device);
  ASSERT_TRUE(kernels::cuda::SetDevice(device.ordinal).ok());
  const std::string base = TempDir(), fp8 = TempDir();
  TestModelSpec spec;
  spec.architecture = "LlamaForCausalLM";
  spec.hidden = 256;
  spec.intermediate = 512;
  spec.heads = 4;
  spec.kv_heads = 4;
  spec.head_dim = 64;
  ASSERT_TRUE(WriteTestModel(base, spec).ok());
  Quantize(base, FineGrained(), fp8);
  auto model = model::LoadModel(fp8);
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t rows = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto plan = parallel::PlanShard((*model)->config, rank, 2, {});
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto w = UploadWeights(**model, *plan, {CudaFp8Prefill::kDequantize});
    ASSERT_TRUE(w.ok()) << w.status();
    const CudaLinear& qkv = w->layers[0].qkv;
    ASSERT_TRUE(qkv.is_fp8());
    for (const CudaFp8Part& p : qkv.fp8) rows += p.rows;
    const CudaLinear& down = w->layers[0].down;
    ASSERT_EQ(down.fp8.size(), 1u);
    EXPECT_EQ(down.fp8[0].in, 256);                               // this rank's 256 of 512 columns
    EXPECT_EQ(down.fp8[0].scales.size(), 2 * 2 * sizeof(float));  // 2 row x 2 column blocks
  }
  EXPECT_EQ(rows, 3 * 256);
  std::filesystem::remove_all(base);
  std::filesystem::remove_all(fp8);
}

// UploadWeights' automatic FP8 prefill choice probes every GPU
// (DetectCudaDevices); the device the runner made current must stay so,
// or its weights land on another GPU (ProbeImage left the last probed one
// current). Seen through device 0's free memory: 1 GiB allocated after the
// probe must come from it. Needs two GPUs.
TEST(CudaFp8WeightsTest, AutomaticPrefillChoiceKeepsTheCurrentDevice) {
  REQUIRE_GPU(device);
  if (detected_.devices.size() < 2) GTEST_SKIP() << "needs two GPUs";
  ASSERT_TRUE(kernels::cuda::SetDevice(0).ok());
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_TRUE(kernels::cuda::CurrentDeviceMemory(&free_before, &total));
  ASSERT_TRUE(SelectCudaFp8Prefill(nullptr).ok());
  auto buf = kernels::cuda::DeviceBuffer::Allocate(size_t{1} << 30);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(kernels::cuda::SetDevice(0).ok());
  ASSERT_TRUE(kernels::cuda::CurrentDeviceMemory(&free_after, &total));
  EXPECT_GE(free_before - std::min(free_before, free_after), size_t{1} << 30)
      << "the allocation after the probe went to another device";
}

// The fixtures of tests/gpu/make_fp8_fixtures.py: the CUDA runner against
// the CPU runner on each (the CPU runner's parity with the reference is
// fp8_fixture_parity_test's).
class CudaFp8FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFp8FixtureTest, MatchesTheCpuRunner) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  const std::string dir = absl::StrCat(src ? src : ".", "/tests/fixtures/models/", GetParam());
  if (!std::filesystem::exists(dir + "/config.json")) {
    GTEST_SKIP() << "fixture " << dir
                 << " absent: run tests/gpu/make_fp8_fixtures.py on the GPU machine";
  }
  REQUIRE_GPU(device);
  auto model = model::LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::LoadedModel* m = model->get();
  if (absl::Status s = CheckCudaFp8Support(m->config, parallel::FullPlan(m->config)); !s.ok()) {
    GTEST_SKIP() << "the CUDA runner refuses " << GetParam() << ": " << s;
  }
  CpuRunnerOptions cpu_options;
  cpu_options.num_kv_blocks = 8;
  auto cpu = CpuModelRunner::Create(m, cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t vocab = m->config.vocab_size;
  const RunResult want = RunGreedy(**cpu, cpu_options.block_size, vocab);
  for (bool graphs : {false, true}) {
    CudaRunnerOptions options = TestOptions(16, 64);
    options.cuda_graphs = graphs;
    auto gpu = CudaModelRunner::Create(m, device, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ExpectParity(RunGreedy(**gpu, options.block_size, vocab), want, vocab,
                 absl::StrCat(GetParam(), graphs ? "_graphs" : ""));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFp8FixtureTest,
                         ::testing::Values("llama3_fp8_block", "qwen3_fp8_block", "qwen3_ct_tensor",
                                           "llama3_ct_channel", "qwen3_ct_block"));

}  // namespace
}  // namespace tessera::runner
