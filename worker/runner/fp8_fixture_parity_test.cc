// Parity of the FP8 forward pass with the reference of
// tests/gpu/make_fp8_fixtures.py (transformers in fp32 on the dequantized
// checkpoint, plus the PyTorch emulation of the activation quantization),
// for the fine-grained block format and compressed-tensors in each weight
// strategy, on the CPU runner with both CPU backends. A fixture that has
// not been generated yet is reported as skipped, naming the script.
//
// Tolerances. Weights dequantize exactly and both sides sum in fp32, but
// activation quantization is a step function: where an activation lands
// within fp32 rounding noise of an e4m3 rounding boundary, the two sides
// may pick neighbouring e4m3 values (a 1/8 relative step of that element),
// and every later token that attends to the changed K/V inherits it. Rows
// before the first such flip agree to 1e-4 of the scale (measured: the
// optimized backend's 7-token prompts are exact to 4 digits), rows after
// it do not. Measured on the GPU machine's CPU against the five fixtures
// (2026-12-02): max error up to 0.12 of the logit scale, mean up to 0.015 of
// it (the reference backend, whose other summation order flips more), and
// greedy continuations diverging at reference margins up to 0.28. Hence,
// with ~1.3x headroom:
//   max |logit - expected| <= 0.15 * max(1, max |expected|)
//   mean |logit - expected| <= 0.02 * max(1, max |expected|)
// and a greedy difference is accepted only where the reference's top-1
// minus top-2 logit at that step is below kNearTie = 0.35; the comparison of
// that prompt stops there (the sequences diverge). A scale-layout, block or
// format error moves the logits by the order of the scale itself.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::runner {
namespace {

constexpr float kMaxRel = 0.15f;
constexpr float kMeanRel = 0.02f;
constexpr float kNearTie = 0.35f;

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

class Fp8FixtureParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8FixtureParityTest, LogitsAndGreedyContinuationsMatchTheReference) {
  const std::string dir = FixtureDir(GetParam());
  if (!std::filesystem::exists(dir + "/expected.json")) {
    GTEST_SKIP() << "fixture " << dir
                 << " absent: run tests/gpu/make_fp8_fixtures.py on the GPU machine";
  }
  std::ifstream in(dir + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json expected = nlohmann::json::parse(ss.str());
  auto model = model::LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->config.quantization.has_value());
  auto logits_file = model::SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  ASSERT_TRUE(logits_file.ok()) << logits_file.status();

  for (const char* backend : {"cpu", "cpu_reference"}) {
    SCOPED_TRACE(backend);
    CpuRunnerOptions options;
    options.block_size = 16;
    options.num_kv_blocks = 32;
    options.kernels = std::string(backend) == "cpu" ? &kernels::OptimizedCpuKernels()
                                                    : &kernels::ReferenceCpuKernels();
    auto runner = CpuModelRunner::Create(model->get(), options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    const int64_t vocab = (*model)->config.vocab_size;
    const auto& prompts = expected["prompts"];
    ASSERT_GE(prompts.size(), 3u);
    for (size_t p = 0; p < prompts.size(); ++p) {
      SCOPED_TRACE(absl::StrCat("prompt ", p));
      std::vector<int32_t> prompt = prompts[p].get<std::vector<int32_t>>();
      std::vector<int32_t> blocks(8);
      std::iota(blocks.begin(), blocks.end(), 0);
      ForwardBatch batch;
      batch.block_table_stride = 8;
      batch.AddSequence(prompt, 0, blocks, options.block_size, false);
      for (int i = 0; i < static_cast<int>(prompt.size()); ++i) batch.logits_indices.push_back(i);
      std::vector<float> logits;
      ASSERT_TRUE((*runner)->Forward(batch, &logits).ok());

      auto want_view = (*logits_file)->Get(absl::StrCat("logits_", p));
      ASSERT_TRUE(want_view.ok()) << want_view.status();
      auto want = model::ToFloat32(*want_view);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(want->size(), logits.size());
      float scale = 1, max_err = 0;
      double sum_err = 0;
      for (size_t i = 0; i < want->size(); ++i) {
        scale = std::max(scale, std::abs((*want)[i]));
        const float e = std::abs((*want)[i] - logits[i]);
        max_err = std::max(max_err, e);
        sum_err += e;
      }
      const float mean_err = static_cast<float>(sum_err / want->size());
      RecordProperty(absl::StrCat(backend, "_prompt", p, "_max_abs_error"), absl::StrCat(max_err));
      RecordProperty(absl::StrCat(backend, "_prompt", p, "_mean_abs_error"),
                     absl::StrCat(mean_err));
      EXPECT_LE(max_err, kMaxRel * scale) << "at logit scale " << scale;
      EXPECT_LE(mean_err, kMeanRel * scale) << "at logit scale " << scale;

      const std::vector<int32_t> want_tokens =
          expected["greedy_continuations"][p].get<std::vector<int32_t>>();
      const std::vector<float> margins = expected["greedy_margins"][p].get<std::vector<float>>();
      ASSERT_EQ(margins.size(), want_tokens.size());
      std::vector<float> last(logits.end() - vocab, logits.end());
      int32_t pos = static_cast<int32_t>(prompt.size());
      for (size_t step = 0; step < want_tokens.size(); ++step) {
        int32_t next = 0;
        kernels::cpu::reference::Argmax(last.data(), 1, vocab, &next);
        if (next != want_tokens[step]) {
          EXPECT_LT(margins[step], kNearTie)
              << "step " << step << ": got token " << next << ", reference " << want_tokens[step]
              << " with a margin of " << margins[step] << " (not a near tie)";
          RecordProperty(absl::StrCat(backend, "_prompt", p, "_diverged_at"),
                         static_cast<int>(step));
          break;
        }
        ForwardBatch decode;
        decode.block_table_stride = 8;
        decode.AddSequence({next}, pos++, blocks, options.block_size, true);
        ASSERT_TRUE((*runner)->Forward(decode, &last).ok());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Fp8FixtureParityTest,
                         ::testing::Values("llama3_fp8_block", "qwen3_fp8_block", "qwen3_ct_tensor",
                                           "llama3_ct_channel", "qwen3_ct_block"));

}  // namespace
}  // namespace tessera::runner
