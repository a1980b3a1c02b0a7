// Parity with Hugging Face transformers on the tiny reference models in
// tests/fixtures/models (made by tests/gpu/make_fixtures.py, and
// make_moe_fixtures.py for the mixture-of-experts qwen3_moe_tiny and
// glm4_moe_tiny, which also record every router's choices): the CPU
// forward pass reproduces transformers' logits for every prompt position,
// and greedy decoding reproduces its 32-token continuations exactly.
//
// Tolerance: max |logit - expected| <= 1e-4 * max(1, max |expected|). The
// fixtures' logits are float32 computations of the saved weights (bf16
// weights upcast to float32 for qwen3_tiny_bf16), so the same bound holds
// for bf16 checkpoints: widening bf16 to fp32 is exact, and only the order
// of fp32 summation differs between the two implementations.
#include <cmath>
#include <cstdlib>
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

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

class FixtureParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureParityTest, LogitsAndGreedyContinuationsMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << "missing fixture " << dir << "/expected.json";
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json expected = nlohmann::json::parse(ss.str());
  auto model = model::LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
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
      float scale = 1, err = 0;
      for (size_t i = 0; i < want->size(); ++i) {
        scale = std::max(scale, std::abs((*want)[i]));
        err = std::max(err, std::abs((*want)[i] - logits[i]));
      }
      RecordProperty(absl::StrCat(backend, "_prompt", p, "_max_abs_error"), absl::StrCat(err));
      EXPECT_LE(err, 1e-4f * scale) << "max abs error " << err << " at logit scale " << scale;

      // Greedy continuation: argmax of the last position, then decode.
      std::vector<int32_t> want_tokens =
          expected["greedy_continuations"][p].get<std::vector<int32_t>>();
      std::vector<int32_t> got;
      std::vector<float> last(logits.end() - vocab, logits.end());
      int32_t pos = static_cast<int32_t>(prompt.size());
      for (size_t step = 0; step < want_tokens.size(); ++step) {
        int32_t next = 0;
        kernels::cpu::reference::Argmax(last.data(), 1, vocab, &next);
        got.push_back(next);
        ForwardBatch decode;
        decode.block_table_stride = 8;
        decode.AddSequence({next}, pos++, blocks, options.block_size, true);
        ASSERT_TRUE((*runner)->Forward(decode, &last).ok());
      }
      EXPECT_EQ(got, want_tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureParityTest,
                         ::testing::Values("llama3_tiny", "qwen2_tiny", "qwen3_tiny",
                                           "qwen3_tiny_bf16", "mistral_tiny", "qwen3_moe_tiny",
                                           "qwen3_moe_d64", "glm4_moe_d64", "glm4_moe_tiny"));

}  // namespace
}  // namespace tessera::runner
