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

// What the CUDA runner cannot run of an FP8 checkpoint is refused before
// any device call (CheckCudaFp8Support), naming what and why; a supported
// FP8 config gets past those checks (here to Init, which needs a GPU).
class CudaFp8RefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(small_.model.ok()) << small_.model.status();
    config_ = small_.model->get()->config;
    config_.quantization.emplace();  // fine-grained FP8, 128x128 blocks, dynamic group 128
  }

  // Create with a factory that must not be reached.
  absl::Status Create(const model::ModelConfig& config, CudaRunnerOptions options) {
    auto runner = CudaModelRunner::Create(
        config,
        [&](const model::ModelConfig&, const parallel::ShardPlan&) -> absl::StatusOr<CudaWeights> {
          called_ = true;
          return absl::InternalError("not reached");
        },
        kernels::DeviceDescription{}, std::move(options));
    return runner.status();
  }

  SmallTestModel small_{"LlamaForCausalLM", 64};
  model::ModelConfig config_;
  bool called_ = false;
};

TEST_F(CudaFp8RefusalTest, SupportedFp8ConfigsAreNoLongerRefused) {
  const absl::Status s = Create(config_, TestOptions(16, 64));
  ASSERT_FALSE(s.ok());  // no CUDA device given
  EXPECT_NE(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("needs a CUDA device"));
  EXPECT_FALSE(called_);
}

TEST_F(CudaFp8RefusalTest, MixtureOfExpertsFp8IsRefused) {
  config_.moe.emplace();
  const absl::Status s = Create(config_, TestOptions(16, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("FP8 mixture-of-experts checkpoints (fp8 (fine-grained)"));
  EXPECT_THAT(s.message(), HasSubstr("part 3"));
  EXPECT_FALSE(called_);
}

TEST_F(CudaFp8RefusalTest, PartialRopeFp8IsRefused) {
  config_.partial_rotary_factor = 0.5;
  const absl::Status s = Create(config_, TestOptions(16, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("partial RoPE (rotary dim 32 of head_dim 64)"));
  EXPECT_FALSE(called_);
}

// Two ranks of 2 KV heads x 64 rows: each rank's k/v rows [0, 64) cut the
// 128-row scale block; o_proj/q rows (2 heads = 128) would not.
TEST_F(CudaFp8RefusalTest, TensorParallelSlicesThatCutAScaleBlockAreRefused) {
  auto plan = parallel::PlanShard(config_, 0, 2, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  CudaRunnerOptions options = TestOptions(16, 64);
  options.shard = *plan;
  const absl::Status s = Create(config_, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 0 would hold rows [0, 64) of 128 of the FP8 "
                                     "k_proj/v_proj, which cuts a 128 x 128 weight-scale block"));
  EXPECT_FALSE(called_);
  // Per-channel scales slice anywhere.
  config_.quantization->weight_strategy = model::WeightScaleStrategy::kChannel;
  config_.quantization->method = model::QuantMethod::kCompressedTensorsFp8;
  EXPECT_THAT(std::string(Create(config_, options).message()), HasSubstr("needs a CUDA device"));
}

TEST_F(CudaFp8RefusalTest, ActivationGroupsOtherThan128AreRefused) {
  config_.quantization->activation_group = 64;
  const absl::Status s = Create(config_, TestOptions(16, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("activation groups of 64"));
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
