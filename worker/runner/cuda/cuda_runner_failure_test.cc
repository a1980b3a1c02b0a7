// The CUDA runner's failure paths for bad weights: a weights factory that
// makes the wrong number of layers, a model whose layer list disagrees
// with its config, and shard plans whose slices fall outside a tensor.
// Each must be a clear error naming what is wrong, never a crash. The cases that
// fail before any device call run without a GPU too (HOST_CASES).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cuda/cuda_runner_test_util.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {
namespace {

using ::testing::HasSubstr;

// The uploaded weights of `model` with their layer list cut or padded to
// `layers` entries.
CudaWeightsFactory WeightsWithLayers(const model::LoadedModel* model, int64_t layers) {
  return [model, layers](const model::ModelConfig&,
                         const parallel::ShardPlan& plan) -> absl::StatusOr<CudaWeights> {
    absl::StatusOr<CudaWeights> w = UploadWeights(*model, plan);
    if (!w.ok()) return w.status();
    w->layers.resize(static_cast<size_t>(layers));
    return w;
  };
}

// FP8 checkpoints are refused before any device call, naming the format
// (the CUDA linear seam holds bf16 weights only so far).
TEST(CudaRunnerFailureTest, CreateRefusesFp8CheckpointsClearly) {
  SmallTestModel small("LlamaForCausalLM", 64);
  ASSERT_TRUE(small.model.ok()) << small.model.status();
  model::ModelConfig config = small.model->get()->config;
  config.quantization.emplace();  // fine-grained FP8, 128x128 blocks
  bool called = false;
  auto runner = CudaModelRunner::Create(
      config,
      [&](const model::ModelConfig&, const parallel::ShardPlan&) -> absl::StatusOr<CudaWeights> {
        called = true;
        return absl::InternalError("not reached");
      },
      kernels::DeviceDescription{}, TestOptions(16, 64));
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(runner.status().message(),
              HasSubstr("FP8 checkpoints (fp8 (fine-grained): e4m3 weights, 128x128 block scales"));
  EXPECT_THAT(runner.status().message(), HasSubstr("--device=cpu"));
  EXPECT_FALSE(called);
}

TEST(CudaRunnerFailureTest, CreateRefusesWeightsForAnotherNumberOfLayers) {
  REQUIRE_GPU(device);
  SmallTestModel small("LlamaForCausalLM", 64);
  ASSERT_TRUE(small.model.ok()) << small.model.status();
  const model::LoadedModel* model = small.model->get();
  const int64_t layers = model->config.num_hidden_layers;
  ASSERT_GE(layers, 2);
  for (int64_t made : {int64_t{0}, layers - 1, layers + 1}) {
    auto runner = CudaModelRunner::Create(model->config, WeightsWithLayers(model, made), device,
                                          TestOptions(16, 64));
    ASSERT_FALSE(runner.ok()) << made << " layers";
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(runner.status().message(),
                HasSubstr(absl::StrCat("weights for ", made, " layers, the config has ", layers)));
  }
  // A factory's own error reaches the caller unchanged.
  auto failing = CudaModelRunner::Create(
      model->config,
      [](const model::ModelConfig&, const parallel::ShardPlan&) -> absl::StatusOr<CudaWeights> {
        return absl::DataLossError("shard 3 of 4 is truncated");
      },
      device, TestOptions(16, 64));
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(failing.status().message(), HasSubstr("shard 3 of 4 is truncated"));
  // The right number of layers passes the same check.
  auto right = CudaModelRunner::Create(model->config, WeightsWithLayers(model, layers), device,
                                       TestOptions(16, 64));
  EXPECT_TRUE(right.ok()) << right.status();
}

TEST(CudaRunnerFailureTest, UploadWeightsRefusesAVocabularySliceOutsideTheEmbedding) {
  SmallTestModel small("LlamaForCausalLM", 64);
  ASSERT_TRUE(small.model.ok()) << small.model.status();
  const model::LoadedModel& model = **small.model;
  const int64_t vocab = model.config.vocab_size;
  for (parallel::Range bad : {parallel::Range{vocab - 8, 16}, parallel::Range{-4, 8}}) {
    parallel::ShardPlan plan = parallel::FullPlan(model.config);
    plan.vocab = bad;
    absl::StatusOr<CudaWeights> w = UploadWeights(model, plan);
    ASSERT_FALSE(w.ok()) << "vocabulary rows from " << bad.start;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(w.status().message(), HasSubstr("model.embed_tokens.weight"));
  }
}

// A hand-built model whose layer list disagrees with its config: refused
// before any upload (the loop would read past the list), with or without a GPU.
TEST(CudaRunnerFailureTest, UploadWeightsRefusesAModelWithAnotherNumberOfLayers) {
  SmallTestModel small("LlamaForCausalLM", 64);
  ASSERT_TRUE(small.model.ok()) << small.model.status();
  model::LoadedModel& model = **small.model;
  const int64_t layers = model.config.num_hidden_layers;
  ASSERT_GE(layers, 2);
  model.weights.layers.resize(static_cast<size_t>(layers - 1));
  absl::StatusOr<CudaWeights> w = UploadWeights(model, parallel::FullPlan(model.config));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr(absl::StrCat("weights for ", layers - 1,
                                                           " layers, its config has ", layers)));
}

// The layer slices need the device: the embedding and norms before them
// are uploaded first.
TEST(CudaRunnerFailureTest, UploadWeightsRefusesLayerSlicesOutsideATensor) {
  REQUIRE_GPU(device);
  ASSERT_TRUE(kernels::cuda::SetDevice(device.ordinal).ok());
  SmallTestModel small("LlamaForCausalLM", 64);
  ASSERT_TRUE(small.model.ok()) << small.model.status();
  const model::LoadedModel& model = **small.model;
  const model::ModelConfig& c = model.config;
  struct Case {
    const char* what;
    void (*narrow)(parallel::ShardPlan*, const model::ModelConfig&);
    const char* tensor;
  };
  const Case cases[] = {
      {"query heads past the last",
       [](parallel::ShardPlan* p, const model::ModelConfig& c) {
         p->q_heads = {c.num_attention_heads - 1, 2};
       },
       "layer 0 qkv: tensor \"model.layers.0.self_attn.q_proj.weight\""},
      {"KV heads past the last",
       [](parallel::ShardPlan* p, const model::ModelConfig& c) {
         p->kv_heads = {c.num_key_value_heads - 1, 2};
       },
       "layer 0 qkv: tensor \"model.layers.0.self_attn.k_proj.weight\""},
      {"intermediate rows past the last",
       [](parallel::ShardPlan* p, const model::ModelConfig& c) {
         p->intermediate = {c.intermediate_size - 8, 16};
       },
       "layer 0 gate_up: tensor \"model.layers.0.mlp.gate_proj.weight\""},
      {"intermediate rows before the first",
       [](parallel::ShardPlan* p, const model::ModelConfig&) {
         p->intermediate = {-4, 8};
       },
       "layer 0 gate_up: tensor \"model.layers.0.mlp.gate_proj.weight\""},
  };
  for (const Case& k : cases) {
    parallel::ShardPlan plan = parallel::FullPlan(c);
    k.narrow(&plan, c);
    absl::StatusOr<CudaWeights> w = UploadWeights(model, plan);
    ASSERT_FALSE(w.ok()) << k.what;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kOutOfRange) << k.what;
    EXPECT_THAT(w.status().message(), HasSubstr(k.tensor)) << k.what;
  }
  // The unchanged plan uploads.
  EXPECT_TRUE(UploadWeights(model, parallel::FullPlan(c)).ok());
}

}  // namespace
}  // namespace tessera::runner
