// Parity of the CPU runner's multi-head latent attention models with
// Hugging Face transformers, on the tiny random DeepseekV3ForCausalLM
// fixtures of tests/gpu/make_mla_fixtures.py (with and without q_lora_rank,
// interleaved and rotate-half RoPE, YaRN with and without mscale_all_dim,
// group-limited routing with a shared expert, dense first layers, a bf16
// checkpoint, Kimi K2's model_type and routing, a multi-token-prediction
// layer to skip). A fixture that has not been generated yet is reported as
// skipped, naming the script to run on the GPU machine.
//
// Checked, for both CPU backends and both attention forms (absorbed, as
// served, and naive):
//   - the RoPE table equals transformers' rope_inv_freq within 1 ulp-scale
//     (relative 1e-6), and the cos/sin attention factor and softmax scale
//     equal the reference's (relative 1e-9: both are double formulas);
//   - logits at every prompt position (prompts of 5 to 200 tokens, past
//     YaRN's original 128 positions): max |logit - expected| <= kMaxRel *
//     max(1, max |expected|) with kMaxRel = 2e-4. Both sides compute in
//     float32 from the same weights; only summation order differs (the
//     absorbed form also reassociates the latent products), which stays
//     near 1e-5 relative; 2e-4 leaves headroom for the 200-token prompts;
//   - greedy continuations (32 tokens) equal the reference's until the first
//     difference; a difference is accepted only at a near tie, where the
//     reference's top-1 minus top-2 margin at that step is below twice the
//     logit tolerance (2 x kMaxRel x scale: the most the two sides' logits
//     may differ by, so a flip there is rounding, not a bug), and the
//     comparison of that prompt stops there.
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
#include "worker/model/rope.h"
#include "worker/model/safetensors.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::runner {
namespace {

constexpr float kMaxRel = 2e-4f;

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

std::vector<float> Floats(const model::SafetensorsFile& f, const std::string& name) {
  auto view = f.Get(name);
  EXPECT_TRUE(view.ok()) << view.status();
  if (!view.ok()) return {};
  auto v = model::ToFloat32(*view);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<float>();
}

class MlaFixtureParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaFixtureParityTest, LogitsAndGreedyContinuationsMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  if (!std::filesystem::exists(dir + "/expected.json")) {
    GTEST_SKIP() << "fixture " << dir
                 << " absent: run python3 tests/gpu/make_mla_fixtures.py on the GPU machine";
  }
  std::ifstream in(dir + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(ss.str());
  auto model = model::LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& c = (*model)->config;
  ASSERT_TRUE(c.mla.has_value());
  EXPECT_EQ(c.model_type, expected["model_type"].get<std::string>());
  EXPECT_EQ((*model)->weights.skipped_tensors.size(),
            expected["mtp_tensors_appended"].get<size_t>());
  auto logits_file = model::SafetensorsFile::Open(dir + "/expected_logits.safetensors");
  ASSERT_TRUE(logits_file.ok()) << logits_file.status();

  // The RoPE table and both YaRN corrections.
  auto inv_freq = model::RopeInverseFrequencies(c);
  ASSERT_TRUE(inv_freq.ok()) << inv_freq.status();
  const std::vector<float> want_freq = Floats(**logits_file, "rope_inv_freq");
  ASSERT_EQ(inv_freq->size(), want_freq.size());
  for (size_t i = 0; i < want_freq.size(); ++i) {
    EXPECT_NEAR((*inv_freq)[i], want_freq[i], 1e-6f * want_freq[i]) << "inv_freq[" << i << "]";
  }
  const double want_factor = expected["rope_attention_scaling"].get<double>();
  const double want_scale = expected["softmax_scale"].get<double>();
  EXPECT_NEAR(c.mla->rope_attention_factor, want_factor, 1e-9 * want_factor);
  EXPECT_NEAR(c.mla->softmax_scale, want_scale, 1e-9 * want_scale);

  for (const char* backend : {"cpu", "cpu_reference"}) {
    for (MlaForm form : {MlaForm::kAbsorbed, MlaForm::kNaive}) {
      const std::string label =
          absl::StrCat(backend, form == MlaForm::kAbsorbed ? "_absorbed" : "_naive");
      SCOPED_TRACE(label);
      CpuRunnerOptions options;
      options.block_size = 16;
      options.num_kv_blocks = 32;
      options.mla_form = form;
      options.kernels = std::string(backend) == "cpu" ? &kernels::OptimizedCpuKernels()
                                                      : &kernels::ReferenceCpuKernels();
      auto runner = CpuModelRunner::Create(model->get(), options);
      ASSERT_TRUE(runner.ok()) << runner.status();
      const int64_t vocab = c.vocab_size;
      const auto& prompts = expected["prompts"];
      ASSERT_GE(prompts.size(), 3u);
      for (size_t p = 0; p < prompts.size(); ++p) {
        SCOPED_TRACE(absl::StrCat("prompt ", p));
        const std::vector<int32_t> prompt = prompts[p].get<std::vector<int32_t>>();
        std::vector<int32_t> blocks(16);
        std::iota(blocks.begin(), blocks.end(), 0);
        // Fresh block ranges per prompt are not needed: each prompt starts at
        // position 0 and overwrites its slots.
        ForwardBatch batch;
        batch.block_table_stride = 16;
        batch.AddSequence(prompt, 0, blocks, options.block_size, false);
        for (int i = 0; i < static_cast<int>(prompt.size()); ++i) batch.logits_indices.push_back(i);
        std::vector<float> logits;
        ASSERT_TRUE((*runner)->Forward(batch, &logits).ok());
        const std::vector<float> want = Floats(**logits_file, absl::StrCat("logits_", p));
        ASSERT_EQ(want.size(), logits.size());
        float scale = 1, err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          scale = std::max(scale, std::abs(want[i]));
          err = std::max(err, std::abs(want[i] - logits[i]));
        }
        RecordProperty(absl::StrCat(label, "_prompt", p, "_max_abs_error"), absl::StrCat(err));
        EXPECT_LE(err, kMaxRel * scale) << "max abs error " << err << " at logit scale " << scale;

        const std::vector<int32_t> want_tokens =
            expected["greedy_continuations"][p].get<std::vector<int32_t>>();
        const std::vector<float> margins = expected["greedy_margins"][p].get<std::vector<float>>();
        ASSERT_EQ(margins.size(), want_tokens.size());
        const float near_tie = 2 * kMaxRel * scale;
        std::vector<float> last(logits.end() - vocab, logits.end());
        int32_t pos = static_cast<int32_t>(prompt.size());
        for (size_t step = 0; step < want_tokens.size(); ++step) {
          int32_t next = 0;
          kernels::cpu::reference::Argmax(last.data(), 1, vocab, &next);
          if (next != want_tokens[step]) {
            EXPECT_LT(margins[step], near_tie)
                << "step " << step << ": got token " << next << ", reference " << want_tokens[step]
                << " with a margin of " << margins[step] << " (not a near tie)";
            RecordProperty(absl::StrCat(label, "_prompt", p, "_diverged_at"),
                           static_cast<int>(step));
            break;
          }
          ForwardBatch decode;
          decode.block_table_stride = 16;
          decode.AddSequence({next}, pos++, blocks, options.block_size, true);
          ASSERT_TRUE((*runner)->Forward(decode, &last).ok());
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MlaFixtureParityTest,
                         ::testing::Values("deepseek_v3_tiny", "deepseek_v3_tiny_bf16",
                                           "deepseek_v3_plain_q", "deepseek_v3_wide",
                                           "kimi_k2_tiny"));

}  // namespace
}  // namespace tessera::runner
