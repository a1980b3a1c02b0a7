#include "worker/model/weights.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "base/str_cat.h"

namespace tessera::model {
namespace {

constexpr std::string_view kLayerPrefix = "model.layers.";

// Binds tensors by name while recording which names were used.
class Binder {
 public:
  explicit Binder(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  absl::Status Bind(const std::string& name, std::vector<int64_t> shape, TensorView* out) {
    const TensorView* view = checkpoint_.Find(name);
    if (view == nullptr) {
      return absl::NotFoundError(Cat(checkpoint_.description(), ": missing tensor \"", name,
                                     "\" (expected shape ", ShapeString(shape), ")"));
    }
    if (view->shape != shape) {
      return absl::InvalidArgumentError(Cat(checkpoint_.description(), ": tensor \"", name,
                                            "\" has shape ", ShapeString(view->shape),
                                            " but the config needs ", ShapeString(shape)));
    }
    if (!IsFloatWeightDType(view->dtype)) {
      return absl::InvalidArgumentError(Cat(checkpoint_.description(), ": tensor \"", name,
                                            "\" has dtype ", DTypeName(view->dtype),
                                            "; weights must be F32, F16 or BF16"));
    }
    *out = *view;
    used_.insert(name);
    return absl::OkStatus();
  }

  absl::Status BindOptional(bool wanted, const std::string& name, std::vector<int64_t> shape,
                            std::optional<TensorView>* out) {
    if (!wanted) return absl::OkStatus();
    out->emplace();
    return Bind(name, std::move(shape), &**out);
  }

  void MarkUsed(const std::string& name) { used_.insert(name); }
  bool Used(const std::string& name) const { return used_.contains(name); }

 private:
  const Checkpoint& checkpoint_;
  absl::flat_hash_set<std::string> used_;
};

// The layer index of "model.layers.<N>.<rest>", or -1.
int64_t LayerIndexOf(std::string_view name) {
  if (!name.starts_with(kLayerPrefix)) return -1;
  name.remove_prefix(kLayerPrefix.size());
  int64_t index = -1;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), index);
  if (ec != std::errc() || end == name.data() || end == name.data() + name.size() || *end != '.') {
    return -1;
  }
  return index;
}

std::string LayerName(int64_t layer, std::string_view suffix) {
  return Cat(kLayerPrefix, layer, ".", suffix);
}

}  // namespace

std::vector<std::string> RequiredTensorNames(const ModelConfig& config) {
  std::vector<std::string> names = {"model.embed_tokens.weight"};
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    names.push_back(LayerName(l, "input_layernorm.weight"));
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      names.push_back(LayerName(l, Cat("self_attn.", p, ".weight")));
    }
    if (config.qkv_bias) {
      for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
        names.push_back(LayerName(l, Cat("self_attn.", p, ".bias")));
      }
    }
    if (config.o_proj_bias) names.push_back(LayerName(l, "self_attn.o_proj.bias"));
    if (config.qk_norm) {
      names.push_back(LayerName(l, "self_attn.q_norm.weight"));
      names.push_back(LayerName(l, "self_attn.k_norm.weight"));
    }
    names.push_back(LayerName(l, "post_attention_layernorm.weight"));
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      names.push_back(LayerName(l, Cat("mlp.", p, ".weight")));
      if (config.mlp_bias) names.push_back(LayerName(l, Cat("mlp.", p, ".bias")));
    }
  }
  names.push_back("model.norm.weight");
  if (!config.tie_word_embeddings) names.push_back("lm_head.weight");
  return names;
}

absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config,
                                              const Checkpoint& checkpoint) {
  const int64_t H = config.hidden_size;
  const int64_t I = config.intermediate_size;
  const int64_t V = config.vocab_size;
  const int64_t D = config.head_dim;
  const int64_t Q = config.q_size();
  const int64_t K = config.kv_size();

  // A checkpoint with more layers than the config is a mismatch, not spare data.
  for (const std::string& name : checkpoint.TensorNames()) {
    const int64_t layer = LayerIndexOf(name);
    if (layer >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(
          Cat(checkpoint.description(), ": tensor \"", name, "\" belongs to layer ", layer,
              " but the config has num_hidden_layers = ", config.num_hidden_layers));
    }
  }

  Binder b(checkpoint);
  ModelWeights w;
  if (absl::Status s = b.Bind("model.embed_tokens.weight", {V, H}, &w.embed_tokens); !s.ok()) {
    return s;
  }
  w.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    auto attn = [&](std::string_view s) { return LayerName(l, Cat("self_attn.", s)); };
    auto mlp = [&](std::string_view s) { return LayerName(l, Cat("mlp.", s)); };
    for (absl::Status s : {
             b.Bind(LayerName(l, "input_layernorm.weight"), {H}, &lw.input_layernorm),
             b.Bind(attn("q_proj.weight"), {Q, H}, &lw.q_proj),
             b.Bind(attn("k_proj.weight"), {K, H}, &lw.k_proj),
             b.Bind(attn("v_proj.weight"), {K, H}, &lw.v_proj),
             b.Bind(attn("o_proj.weight"), {H, Q}, &lw.o_proj),
             b.BindOptional(config.qkv_bias, attn("q_proj.bias"), {Q}, &lw.q_bias),
             b.BindOptional(config.qkv_bias, attn("k_proj.bias"), {K}, &lw.k_bias),
             b.BindOptional(config.qkv_bias, attn("v_proj.bias"), {K}, &lw.v_bias),
             b.BindOptional(config.o_proj_bias, attn("o_proj.bias"), {H}, &lw.o_bias),
             b.BindOptional(config.qk_norm, attn("q_norm.weight"), {D}, &lw.q_norm),
             b.BindOptional(config.qk_norm, attn("k_norm.weight"), {D}, &lw.k_norm),
             b.Bind(LayerName(l, "post_attention_layernorm.weight"), {H},
                    &lw.post_attention_layernorm),
             b.Bind(mlp("gate_proj.weight"), {I, H}, &lw.gate_proj),
             b.Bind(mlp("up_proj.weight"), {I, H}, &lw.up_proj),
             b.Bind(mlp("down_proj.weight"), {H, I}, &lw.down_proj),
             b.BindOptional(config.mlp_bias, mlp("gate_proj.bias"), {I}, &lw.gate_bias),
             b.BindOptional(config.mlp_bias, mlp("up_proj.bias"), {I}, &lw.up_bias),
             b.BindOptional(config.mlp_bias, mlp("down_proj.bias"), {H}, &lw.down_bias),
         }) {
      if (!s.ok()) return s;
    }
  }
  if (absl::Status s = b.Bind("model.norm.weight", {H}, &w.norm); !s.ok()) return s;
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    w.lm_head_tied = true;
    b.MarkUsed("lm_head.weight");  // ignored when tied, as transformers does
  } else if (absl::Status s = b.Bind("lm_head.weight", {V, H}, &w.lm_head); !s.ok()) {
    return s;
  }
  for (const std::string& name : checkpoint.TensorNames()) {
    if (!b.Used(name)) w.unused_tensors.push_back(name);
  }
  return w;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& dir) {
  auto model = std::make_unique<LoadedModel>();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  if (!config.ok()) return config.status();
  model->config = *std::move(config);
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  model->checkpoint = *std::move(checkpoint);
  absl::StatusOr<ModelWeights> weights = BindModelWeights(model->config, *model->checkpoint);
  if (!weights.ok()) return weights.status();
  model->weights = *std::move(weights);
  return model;
}

}  // namespace tessera::model
