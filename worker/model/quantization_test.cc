// FP8 checkpoints: quantization_config parsing for both formats, and the
// strict checks of every FP8 linear when a model loads, on tiny safetensors
// checkpoints written here (one corruption per test).
#include "worker/model/quantization.h"

#include <cmath>
#include <functional>
#include <limits>

#include "base/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors_writer.h"
#include "worker/model/test_util.h"
#include "worker/model/weights.h"

namespace tessera::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Hidden 160 and intermediate 288: not multiples of 128, so the last block
// of every scale grid is partial (ceil(out/128) x ceil(in/128)).
Json TinyLlama() {
  return Json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 16,
      "hidden_size": 160, "intermediate_size": 288, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "torch_dtype": "bfloat16"})");
}

Json FineGrained() {
  return Json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]})");
}

Json CompressedTensors(std::string_view strategy, const Json& input_activations) {
  Json weights = {{"num_bits", 8},
                  {"type", "float"},
                  {"symmetric", true},
                  {"dynamic", false},
                  {"strategy", strategy}};
  if (strategy == "block") weights["block_structure"] = {128, 128};
  return Json{{"quant_method", "compressed-tensors"},
              {"format", "float-quantized"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights", weights},
                  {"input_activations", input_activations}}}}},
              {"ignore", {"lm_head"}}};
}

Json DynamicPerToken() {
  return Json::parse(R"({"num_bits": 8, "type": "float", "symmetric": true, "dynamic": true,
      "strategy": "token"})");
}

Json StaticPerTensor() {
  return Json::parse(R"({"num_bits": 8, "type": "float", "symmetric": true, "dynamic": false,
      "strategy": "tensor"})");
}

absl::StatusOr<std::optional<QuantizationConfig>> Parse(const Json& q) {
  Json config = TinyLlama();
  config["quantization_config"] = q;
  return ParseQuantizationConfig(config);
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(QuantizationConfigTest, AbsentMeansUnquantized) {
  absl::StatusOr<std::optional<QuantizationConfig>> q = ParseQuantizationConfig(TinyLlama());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->has_value());
}

TEST(QuantizationConfigTest, FineGrainedFp8) {
  absl::StatusOr<std::optional<QuantizationConfig>> q = Parse(FineGrained());
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(q->has_value());
  const QuantizationConfig& c = **q;
  EXPECT_EQ(c.method, QuantMethod::kFineGrainedFp8);
  EXPECT_EQ(c.weight_strategy, WeightScaleStrategy::kBlock);
  EXPECT_EQ(c.block_out, 128);
  EXPECT_EQ(c.block_in, 128);
  EXPECT_EQ(c.activation, ActivationQuant::kDynamicTokenGroup);
  EXPECT_EQ(c.activation_group, 128);
  EXPECT_EQ(c.weight_scale_suffix(), "weight_scale_inv");
  EXPECT_FALSE(c.IsQuantizedModule("lm_head"));
  EXPECT_TRUE(c.IsQuantizedModule("model.layers.0.self_attn.q_proj"));
  EXPECT_THAT(c.Describe(), AllOf(HasSubstr("fine-grained"), HasSubstr("128x128 block scales"),
                                  HasSubstr("dynamic per token group of 128")));
}

TEST(QuantizationConfigTest, CompressedTensorsStrategies) {
  struct Case {
    std::string strategy;
    Json activations;
    WeightScaleStrategy want_weights;
    ActivationQuant want_activations;
  };
  Json group = DynamicPerToken();
  group["strategy"] = "group";
  group["group_size"] = 128;
  for (const Case& c : std::vector<Case>{
           {"tensor", StaticPerTensor(), WeightScaleStrategy::kTensor,
            ActivationQuant::kStaticTensor},
           {"channel", DynamicPerToken(), WeightScaleStrategy::kChannel,
            ActivationQuant::kDynamicToken},
           {"block", group, WeightScaleStrategy::kBlock, ActivationQuant::kDynamicTokenGroup},
           {"channel", Json(nullptr), WeightScaleStrategy::kChannel, ActivationQuant::kNone},
       }) {
    SCOPED_TRACE(c.strategy);
    absl::StatusOr<std::optional<QuantizationConfig>> q =
        Parse(CompressedTensors(c.strategy, c.activations));
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_TRUE(q->has_value());
    EXPECT_EQ((*q)->method, QuantMethod::kCompressedTensorsFp8);
    EXPECT_EQ((*q)->weight_strategy, c.want_weights);
    EXPECT_EQ((*q)->activation, c.want_activations);
    EXPECT_EQ((*q)->weight_scale_suffix(), "weight_scale");
  }
}

TEST(QuantizationConfigTest, UnsupportedSchemesAreNamed) {
  struct Case {
    std::function<void(Json*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](Json* q) { (*q)["fmt"] = "e5m2"; }, "quantization_config.fmt = \"e5m2\""},
      {[](Json* q) {
         (*q)["weight_block_size"] = {64, 64};
       },
       "weight_block_size = [64,64]: only [128, 128]"},
      {[](Json* q) { (*q)["activation_scheme"] = "static"; }, "activation_scheme"},
      {[](Json* q) { (*q)["quant_method"] = "awq"; }, "quant_method = \"awq\""},
      {[](Json* q) { q->erase("weight_block_size"); }, "weight_block_size is missing"},
  };
  for (const Case& c : cases) {
    Json q = FineGrained();
    c.edit(&q);
    absl::StatusOr<std::optional<QuantizationConfig>> parsed = Parse(q);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented) << parsed.status();
    EXPECT_THAT(Msg(parsed.status()), HasSubstr(c.message));
  }
  const std::vector<Case> ct_cases = {
      {[](Json* q) { (*q)["format"] = "pack-quantized"; }, "format = \"pack-quantized\""},
      {[](Json* q) { (*q)["config_groups"]["group_0"]["weights"]["num_bits"] = 4; },
       "weights.num_bits = 4"},
      {[](Json* q) { (*q)["config_groups"]["group_0"]["weights"]["type"] = "int"; },
       "weights.type = \"int\""},
      {[](Json* q) { (*q)["config_groups"]["group_1"] = (*q)["config_groups"]["group_0"]; },
       "has 2 groups"},
      {[](Json* q) {
         (*q)["kv_cache_scheme"] = {{"num_bits", 8}};
       },
       "kv_cache_scheme"},
      {[](Json* q) { (*q)["config_groups"]["group_0"]["weights"]["strategy"] = "group"; },
       "strategy = \"group\""},
  };
  for (const Case& c : ct_cases) {
    Json q = CompressedTensors("channel", DynamicPerToken());
    c.edit(&q);
    absl::StatusOr<std::optional<QuantizationConfig>> parsed = Parse(q);
    ASSERT_FALSE(parsed.ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented) << parsed.status();
    EXPECT_THAT(Msg(parsed.status()), HasSubstr(c.message));
  }
  Json bad_regex = CompressedTensors("channel", DynamicPerToken());
  bad_regex["ignore"] = {"re:(unclosed"};
  absl::StatusOr<std::optional<QuantizationConfig>> parsed = Parse(bad_regex);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(Msg(parsed.status()), HasSubstr("invalid regular expression \"re:(unclosed\""));
}

TEST(QuantizationConfigTest, ModuleMatching) {
  QuantizationConfig q;
  q.unquantized_modules = {"lm_head", "model.layers.1", "o_proj", "re:.*mlp\\.gate$"};
  EXPECT_FALSE(q.IsQuantizedModule("lm_head"));
  EXPECT_FALSE(q.IsQuantizedModule("model.layers.1.mlp.up_proj"));       // prefix component
  EXPECT_TRUE(q.IsQuantizedModule("model.layers.10.mlp.up_proj"));       // not "layers.1."
  EXPECT_FALSE(q.IsQuantizedModule("model.layers.0.self_attn.o_proj"));  // suffix component
  EXPECT_FALSE(q.IsQuantizedModule("model.layers.0.mlp.gate"));          // regex
  EXPECT_TRUE(q.IsQuantizedModule("model.layers.0.mlp.gate_proj"));
}

// ---------------------------------------------------------------------------
// Checkpoints.

bool IsLinear(const std::string& name) { return name.find("_proj.weight") != std::string::npos; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<float> Values(int64_t n, float scale, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i + seed));
  return v;
}

// Writes config.json (with `quant`) and a checkpoint whose linears are FP8
// with scales as `quant` describes, lets `edit` change the tensors, and
// loads the directory.
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadFp8(
    const Json& quant, const std::function<void(std::vector<TensorToWrite>*)>& edit = {}) {
  Json config_json = TinyLlama();
  config_json["quantization_config"] = quant;
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_json.dump());
  if (!config.ok()) return config.status();
  const QuantizationConfig& q = *config->quantization;
  std::vector<TensorToWrite> tensors;
  int seed = 0;
  for (const TensorSpec& spec : RequiredTensors(*config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    const std::string module = spec.name.substr(0, spec.name.size() - 7);
    if (!IsLinear(spec.name) || !q.IsQuantizedModule(module)) {
      tensors.push_back(*MakeTensor(spec.name, DType::kBF16, spec.shape, Values(n, 0.1f, ++seed)));
      continue;
    }
    tensors.push_back(*MakeTensor(spec.name, DType::kF8E4M3, spec.shape, Values(n, 200.f, ++seed)));
    std::vector<int64_t> scale_shape = WeightScaleShape(q, spec.shape[0], spec.shape[1]);
    int64_t scales = 1;
    for (int64_t d : scale_shape) scales *= d;
    tensors.push_back(*MakeTensor(Cat(module, ".", q.weight_scale_suffix()), DType::kF32,
                                  scale_shape, std::vector<float>(scales, 1e-3f)));
    if (q.activation == ActivationQuant::kStaticTensor) {
      tensors.push_back(*MakeTensor(Cat(module, ".input_scale"), DType::kF32, {1}, {0.01f}));
    }
  }
  if (edit) edit(&tensors);
  const std::string dir = testing::MakeTempDir();
  if (absl::Status s = WriteBinaryFile(dir + "/config.json", config_json.dump()); !s.ok()) return s;
  if (absl::Status s = WriteSafetensorsFile(dir + "/model.safetensors", tensors); !s.ok()) return s;
  return LoadModel(dir);
}

TensorToWrite* Find(std::vector<TensorToWrite>* tensors, std::string_view name) {
  for (TensorToWrite& t : *tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

void Replace(std::vector<TensorToWrite>* tensors, TensorToWrite t) { *Find(tensors, t.name) = t; }

constexpr char kQ[] = "model.layers.0.self_attn.q_proj";
constexpr char kDown[] = "model.layers.0.mlp.down_proj";

TEST(Fp8CheckpointTest, FineGrainedBindsWeightsAndScales) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadFp8(FineGrained());
  ASSERT_TRUE(model.ok()) << model.status();
  const LayerWeights& l = (*model)->weights.layers[0];
  EXPECT_EQ(l.q_proj.dtype, DType::kF8E4M3);
  EXPECT_EQ(l.fp8.size(), 7u);
  const Fp8Scales* down = l.Fp8ScalesOf(l.down_proj);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->weight_scale.name, Cat(kDown, ".weight_scale_inv"));
  EXPECT_EQ(down->weight_scale.shape, (std::vector<int64_t>{2, 3}));  // [160, 288]
  EXPECT_FALSE(down->input_scale.has_value());
  EXPECT_EQ((*model)->weights.lm_head.dtype, DType::kBF16);
  EXPECT_TRUE((*model)->weights.unused_tensors.empty());
}

TEST(Fp8CheckpointTest, CompressedTensorsEveryStrategy) {
  for (const char* strategy : {"tensor", "channel", "block"}) {
    SCOPED_TRACE(strategy);
    absl::StatusOr<std::unique_ptr<LoadedModel>> model =
        LoadFp8(CompressedTensors(strategy, StaticPerTensor()));
    ASSERT_TRUE(model.ok()) << model.status();
    const LayerWeights& l = (*model)->weights.layers[0];
    const Fp8Scales* q = l.Fp8ScalesOf(l.q_proj);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->weight_scale.name, Cat(kQ, ".weight_scale"));
    ASSERT_TRUE(q->input_scale.has_value());
    EXPECT_EQ(q->input_scale->name, Cat(kQ, ".input_scale"));
  }
}

TEST(Fp8CheckpointTest, ModulesToNotConvertStayBf16) {
  Json q = FineGrained();
  q["modules_to_not_convert"] = {"lm_head", "down_proj"};
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadFp8(q);
  ASSERT_TRUE(model.ok()) << model.status();
  const LayerWeights& l = (*model)->weights.layers[0];
  EXPECT_EQ(l.down_proj.dtype, DType::kBF16);
  EXPECT_EQ(l.Fp8ScalesOf(l.down_proj), nullptr);
  EXPECT_EQ(l.fp8.size(), 6u);
}

TEST(Fp8CheckpointTest, WrongScaleShape) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(FineGrained(), [](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(kQ, ".weight_scale_inv"), DType::kF32, {2, 1}, {1, 1}));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("scale \"", kQ, ".weight_scale_inv\" has shape [2, 1]")),
                    HasSubstr("[160, 160] weight with block scales needs [2, 2]")));
}

TEST(Fp8CheckpointTest, MissingScale) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(FineGrained(), [](std::vector<TensorToWrite>* t) {
        std::erase_if(
            *t, [](const TensorToWrite& x) { return x.name == Cat(kDown, ".weight_scale_inv"); });
      });
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("missing tensor \"", kDown, ".weight_scale_inv\"")),
                    HasSubstr(Cat("FP8 weight \"", kDown, ".weight\"")),
                    HasSubstr("expected shape [2, 3]")));
}

TEST(Fp8CheckpointTest, BlockSize64WhenConfigDeclares128) {
  // A [288, 160] gate_proj quantized with 64 x 64 blocks has a [5, 3] grid.
  const std::string gate = "model.layers.0.mlp.gate_proj";
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(FineGrained(), [&](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(gate, ".weight_scale_inv"), DType::kF32, {5, 3},
                               std::vector<float>(15, 1e-3f)));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("scale \"", gate, ".weight_scale_inv\" has shape [5, 3]")),
                    HasSubstr("needs [3, 2]"),
                    HasSubstr("shape for block size 64 x 64, but quantization_config declares "
                              "128 x 128")));
}

TEST(Fp8CheckpointTest, NanScale) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(FineGrained(), [](std::vector<TensorToWrite>* t) {
        std::vector<float> v(6, 1e-3f);
        v[4] = std::numeric_limits<float>::quiet_NaN();
        Replace(t, *MakeTensor(Cat(kDown, ".weight_scale_inv"), DType::kF32, {2, 3}, v));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(model.status()),
              HasSubstr(Cat("scale \"", kDown, ".weight_scale_inv\" is NaN at [1, 1]")));
}

TEST(Fp8CheckpointTest, NegativeOrInfiniteScale) {
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity()}) {
    absl::StatusOr<std::unique_ptr<LoadedModel>> model =
        LoadFp8(FineGrained(), [&](std::vector<TensorToWrite>* t) {
          Replace(t, *MakeTensor(Cat(kQ, ".weight_scale_inv"), DType::kF32, {2, 2},
                                 {1e-3f, 1e-3f, bad, 1e-3f}));
        });
    ASSERT_FALSE(model.ok());
    EXPECT_THAT(Msg(model.status()),
                AllOf(HasSubstr(Cat("scale \"", kQ, ".weight_scale_inv\"")), HasSubstr("[1, 0]"),
                      HasSubstr("must be finite and >= 0")));
  }
}

TEST(Fp8CheckpointTest, WrongWeightDtype) {
  // A quantized module stored as bf16.
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(FineGrained(), [](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(kQ, ".weight"), DType::kBF16, {160, 160},
                               Values(160 * 160, 0.1f, 1)));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("tensor \"", kQ, ".weight\" has dtype BF16")),
                    HasSubstr("needs an F8_E4M3 [out, in] weight")));
  // An FP8 weight of a module that is not quantized.
  Json q = FineGrained();
  q["modules_to_not_convert"] = {"lm_head", "q_proj"};
  model = LoadFp8(q, [](std::vector<TensorToWrite>* t) {
    Replace(t, *MakeTensor(Cat(kQ, ".weight"), DType::kF8E4M3, {160, 160},
                           Values(160 * 160, 100.f, 1)));
  });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("tensor \"", kQ, ".weight\" has dtype F8_E4M3")),
                    HasSubstr(Cat("lists module \"", kQ, "\" as not quantized"))));
  // A scale of an integer dtype.
  model = LoadFp8(FineGrained(), [](std::vector<TensorToWrite>* t) {
    TensorToWrite* s = Find(t, Cat(kQ, ".weight_scale_inv"));
    s->dtype = DType::kI32;
  });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()),
              HasSubstr(Cat("scale \"", kQ,
                            ".weight_scale_inv\" has dtype I32; FP8 scales must "
                            "be F32, BF16 or F16")));
}

TEST(Fp8CheckpointTest, Fp8WithoutQuantizationConfig) {
  Json config_json = TinyLlama();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_json.dump());
  ASSERT_TRUE(config.ok());
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : RequiredTensors(*config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    tensors.push_back(*MakeTensor(spec.name, IsLinear(spec.name) ? DType::kF8E4M3 : DType::kBF16,
                                  spec.shape, Values(n, 0.1f, 0)));
  }
  const std::string dir = testing::MakeTempDir();
  ASSERT_TRUE(WriteBinaryFile(dir + "/config.json", config_json.dump()).ok());
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/model.safetensors", tensors).ok());
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadModel(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()), HasSubstr("has dtype F8_E4M3 but config.json has no "
                                             "quantization_config"));
}

TEST(Fp8CheckpointTest, CompressedTensorsScaleShapes) {
  // Channel scales are [out, 1]; a flat [out] is refused.
  absl::StatusOr<std::unique_ptr<LoadedModel>> model =
      LoadFp8(CompressedTensors("channel", DynamicPerToken()), [](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(kQ, ".weight_scale"), DType::kF32, {160},
                               std::vector<float>(160, 1e-3f)));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(Msg(model.status()),
              AllOf(HasSubstr(Cat("scale \"", kQ, ".weight_scale\" has shape [160]")),
                    HasSubstr("channel scales needs [160, 1]")));
  // Tensor scales may be [1] or [].
  model =
      LoadFp8(CompressedTensors("tensor", DynamicPerToken()), [](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(kQ, ".weight_scale"), DType::kF32, {}, {1e-3f}));
      });
  EXPECT_TRUE(model.ok()) << model.status();
  // Static activations need input_scale, positive.
  model =
      LoadFp8(CompressedTensors("tensor", StaticPerTensor()), [](std::vector<TensorToWrite>* t) {
        std::erase_if(*t, [](const TensorToWrite& x) { return x.name == Cat(kQ, ".input_scale"); });
      });
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(model.status()),
              HasSubstr(Cat("missing the input_scale of \"", kQ, ".weight\"")));
  model =
      LoadFp8(CompressedTensors("tensor", StaticPerTensor()), [](std::vector<TensorToWrite>* t) {
        Replace(t, *MakeTensor(Cat(kQ, ".input_scale"), DType::kF32, {1}, {0.0f}));
      });
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(
      Msg(model.status()),
      AllOf(HasSubstr(Cat("scale \"", kQ, ".input_scale\" is 0 at [0]")), HasSubstr("> 0")));
}

}  // namespace
}  // namespace tessera::model
