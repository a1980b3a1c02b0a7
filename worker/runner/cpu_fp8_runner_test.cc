// The CPU runner on FP8 checkpoints made here from a random fp32 model:
// each linear quantized to e4m3 with 128x128 block scales, next to an fp32
// checkpoint of the exactly dequantized weights.
//   - weight-only FP8 (compressed-tensors, no input activations) equals the
//     fp32 runner on the dequantized weights up to fp32 summation order
//     (1e-4 relative to the logit scale): the dequantization is exact;
//   - with activation quantization (fine-grained, per token group of 128)
//     the logits move (e4m3 keeps 3 mantissa bits: up to 1/16 relative per
//     activation), on average by under 5e-2 of the logit scale and at most
//     by a quarter of it on this small random model; the exact arithmetic
//     is checked by kernels/cpu/fp8_linear_test.cc and the fixtures; and
//   - tensor parallelism is refused with UNIMPLEMENTED.
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors.h"
#include "worker/model/test_util.h"
#include "worker/parallel/collectives.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

using Json = nlohmann::json;
namespace kc = ::tessera::kernels::cpu;

bool IsLinear(const std::string& name) { return name.find("_proj.weight") != std::string::npos; }

// Reads `dir`'s fp32 model and writes an FP8 copy (config with `quant`) to
// `fp8_dir` and the dequantized fp32 weights to `dequant_dir`.
void Quantize(const std::string& dir, const Json& quant, const std::string& fp8_dir,
              const std::string& dequant_dir) {
  auto file = model::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<model::TensorToWrite> fp8, dequant;
  for (const model::TensorView& t : (*file)->tensors()) {
    auto values = model::ToFloat32(t);
    ASSERT_TRUE(values.ok());
    if (!IsLinear(t.name)) {
      fp8.push_back(*model::MakeTensor(t.name, model::DType::kF32, t.shape, *values));
      dequant.push_back(fp8.back());
      continue;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    std::vector<float> grid(br * bc, 0.f), q(rows * cols), dq(rows * cols);
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        float& g = grid[(o / 128) * bc + i / 128];
        g = std::max(g, std::abs((*values)[o * cols + i]) / kc::kE4m3Max);
      }
    }
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t i = 0; i < cols; ++i) {
        const float s = grid[(o / 128) * bc + i / 128];
        q[o * cols + i] = std::clamp((*values)[o * cols + i] / s, -448.f, 448.f);
        dq[o * cols + i] = kc::E4m3ToFloat(kc::FloatToE4m3(q[o * cols + i])) * s;
      }
    }
    const std::string module = t.name.substr(0, t.name.size() - 7);
    const std::string suffix =
        quant["quant_method"] == "fp8" ? ".weight_scale_inv" : ".weight_scale";
    fp8.push_back(*model::MakeTensor(t.name, model::DType::kF8E4M3, t.shape, q));
    fp8.push_back(*model::MakeTensor(module + suffix, model::DType::kF32, {br, bc}, grid));
    dequant.push_back(*model::MakeTensor(t.name, model::DType::kF32, t.shape, dq));
  }
  std::ifstream in(dir + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  Json config = Json::parse(ss.str());
  ASSERT_TRUE(model::WriteBinaryFile(dequant_dir + "/config.json", config.dump()).ok());
  config["quantization_config"] = quant;
  ASSERT_TRUE(model::WriteBinaryFile(fp8_dir + "/config.json", config.dump()).ok());
  ASSERT_TRUE(model::WriteSafetensorsFile(fp8_dir + "/model.safetensors", fp8).ok());
  ASSERT_TRUE(model::WriteSafetensorsFile(dequant_dir + "/model.safetensors", dequant).ok());
}

// Logits of every position of one prompt, then of 4 greedy decode steps.
std::vector<float> RunModel(const model::LoadedModel& m) {
  CpuRunnerOptions options;
  options.num_kv_blocks = 8;
  auto runner = CpuModelRunner::Create(&m, options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  std::vector<int32_t> prompt = {3, 17, 99, 4, 250, 31, 8, 77, 140, 5, 6};
  std::vector<int32_t> blocks = {0, 1, 2};
  ForwardBatch batch;
  batch.block_table_stride = 3;
  batch.AddSequence(prompt, 0, blocks, options.block_size, false);
  for (int i = 0; i < static_cast<int>(prompt.size()); ++i) batch.logits_indices.push_back(i);
  std::vector<float> all, logits;
  EXPECT_TRUE((*runner)->Forward(batch, &logits).ok());
  all = logits;
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int step = 0; step < 4; ++step) {
    ForwardBatch decode;
    decode.block_table_stride = 3;
    decode.AddSequence({static_cast<int32_t>((step * 37) % 200)}, pos++, blocks, options.block_size,
                       true);
    EXPECT_TRUE((*runner)->Forward(decode, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct Diff {
  float scale = 1, max = 0, mean = 0;
};

Diff Compare(const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d.scale = std::max(d.scale, std::abs(b[i]));
    d.max = std::max(d.max, std::abs(a[i] - b[i]));
    sum += std::abs(a[i] - b[i]);
  }
  d.mean = static_cast<float>(sum / std::max<size_t>(1, a.size()));
  return d;
}

class CpuFp8RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = model::testing::MakeTempDir();
    spec_.hidden = 192;  // 1.5 blocks
    spec_.intermediate = 320;
    spec_.heads = 4;
    spec_.kv_heads = 2;
    spec_.head_dim = 48;
    ASSERT_TRUE(WriteTestModel(base_, spec_).ok());
  }

  std::pair<std::unique_ptr<model::LoadedModel>, std::unique_ptr<model::LoadedModel>> Load(
      const Json& quant) {
    const std::string fp8 = model::testing::MakeTempDir();
    const std::string dequant = model::testing::MakeTempDir();
    Quantize(base_, quant, fp8, dequant);
    auto a = model::LoadModel(fp8);
    auto b = model::LoadModel(dequant);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!a.ok() || !b.ok()) return {};
    return {*std::move(a), *std::move(b)};
  }

  TestModelSpec spec_;
  std::string base_;
};

TEST_F(CpuFp8RunnerTest, WeightOnlyFp8EqualsTheDequantizedModel) {
  Json quant = Json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
        "weights": {"num_bits": 8, "type": "float", "symmetric": true, "dynamic": false,
                    "strategy": "block", "block_structure": [128, 128]}}},
      "ignore": ["lm_head"]})");
  auto [fp8, dequant] = Load(quant);
  ASSERT_NE(fp8, nullptr);
  ASSERT_EQ(fp8->weights.layers[0].fp8.size(), 7u);
  const Diff d = Compare(RunModel(*fp8), RunModel(*dequant));
  EXPECT_LE(d.max, 1e-4f * d.scale) << "scale " << d.scale;
}

TEST_F(CpuFp8RunnerTest, ActivationQuantizationMovesLogitsSlightly) {
  Json quant = Json::parse(R"({"quant_method": "fp8", "fmt": "e4m3",
      "activation_scheme": "dynamic", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["lm_head"]})");
  auto [fp8, dequant] = Load(quant);
  ASSERT_NE(fp8, nullptr);
  const Diff d = Compare(RunModel(*fp8), RunModel(*dequant));
  EXPECT_GT(d.mean, 0.f);  // the activations really are quantized
  EXPECT_LE(d.mean, 5e-2f * d.scale) << "scale " << d.scale << " max " << d.max;
  EXPECT_LE(d.max, 2.5e-1f * d.scale) << "scale " << d.scale << " mean " << d.mean;
}

TEST_F(CpuFp8RunnerTest, TensorParallelIsRefused) {
  Json quant = Json::parse(R"({"quant_method": "fp8", "fmt": "e4m3",
      "activation_scheme": "dynamic", "weight_block_size": [128, 128]})");
  auto [fp8, dequant] = Load(quant);
  ASSERT_NE(fp8, nullptr);
  auto plan = parallel::PlanShard(fp8->config, 0, 2, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  CpuRunnerOptions options;
  options.shard = *plan;
  auto runner = CpuModelRunner::Create(fp8.get(), options);
  ASSERT_FALSE(runner.ok());
  EXPECT_TRUE(absl::IsUnimplemented(runner.status())) << runner.status();
  EXPECT_NE(runner.status().message().find("tensor parallelism"), std::string::npos);
}

}  // namespace
}  // namespace tessera::runner
