#include "worker/model/weights.h"

#include <algorithm>
#include <charconv>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "base/log.h"
#include "base/str_cat.h"

namespace tessera::model {
namespace {

constexpr std::string_view kLayerPrefix = "model.layers.";

// Binds tensors by name while recording which names were used.
class Binder {
 public:
  Binder(const ModelConfig& config, const Checkpoint& checkpoint)
      : config_(config), checkpoint_(checkpoint) {}

  // Where BindLinear puts the scales of FP8 linears (the current layer's).
  void set_fp8_sink(absl::flat_hash_map<std::string, Fp8Scales>* sink) { fp8_sink_ = sink; }

  // A linear projection's weight: FP8 with its scales when the quantization
  // config quantizes the module, else as Bind.
  absl::Status BindLinear(const std::string& name, std::vector<int64_t> shape, TensorView* out) {
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    const std::optional<QuantizationConfig>& q = config_.quantization;
    if (!q || !q->IsQuantizedModule(module)) {
      const TensorView* view = checkpoint_.Find(name);
      if (view != nullptr && view->dtype == DType::kF8E4M3) {
        return absl::InvalidArgumentError(
            Cat(checkpoint_.description(), ": tensor \"", name, "\" has dtype F8_E4M3 but ",
                q ? Cat("quantization_config lists module \"", module, "\" as not quantized")
                  : std::string("config.json has no quantization_config")));
      }
      return Bind(name, std::move(shape), out);
    }
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
    const std::string scale_name = Cat(module, ".", q->weight_scale_suffix());
    const TensorView* scale = checkpoint_.Find(scale_name);
    if (scale == nullptr) {
      return absl::NotFoundError(Cat(checkpoint_.description(), ": missing tensor \"", scale_name,
                                     "\", the scales of the FP8 weight \"", name,
                                     "\" (expected shape ",
                                     ShapeString(WeightScaleShape(*q, shape[0], shape[1])), ")"));
    }
    const std::string input_name = Cat(module, ".input_scale");
    const TensorView* input = checkpoint_.Find(input_name);
    if (absl::Status s = CheckFp8Linear(*q, checkpoint_.description(), *view, *scale, input);
        !s.ok()) {
      return s;
    }
    Fp8Scales scales{*scale, std::nullopt};
    used_.insert(scale_name);
    if (q->activation == ActivationQuant::kStaticTensor) {
      scales.input_scale = *input;
      used_.insert(input_name);
    }
    if (fp8_sink_ != nullptr) fp8_sink_->insert_or_assign(name, std::move(scales));
    *out = *view;
    used_.insert(name);
    return absl::OkStatus();
  }

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
      return absl::InvalidArgumentError(
          Cat(checkpoint_.description(), ": tensor \"", name, "\" has dtype ",
              DTypeName(view->dtype), "; weights must be F32, F16 or BF16",
              view->dtype == DType::kF8E4M3
                  ? " (only the linear projections of an FP8 checkpoint may be F8_E4M3)"
                  : ""));
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
  bool Has(const std::string& name) const { return checkpoint_.Find(name) != nullptr; }
  bool Used(const std::string& name) const { return used_.contains(name); }

 private:
  const ModelConfig& config_;
  const Checkpoint& checkpoint_;
  absl::flat_hash_set<std::string> used_;
  absl::flat_hash_map<std::string, Fp8Scales>* fp8_sink_ = nullptr;
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

// The multi-head latent attention tensors of layer l (weights.h), with
// the shapes the config implies; o_proj last.
std::vector<TensorSpec> MlaSpecs(const ModelConfig& c, int64_t l) {
  const MlaConfig& m = *c.mla;
  const int64_t H = c.hidden_size, n = c.num_attention_heads;
  auto attn = [&](std::string_view s) { return LayerName(l, Cat("self_attn.", s)); };
  std::vector<TensorSpec> out;
  if (m.q_lora_rank > 0) {
    out.push_back({attn("q_a_proj.weight"), {m.q_lora_rank, H}});
    out.push_back({attn("q_a_layernorm.weight"), {m.q_lora_rank}});
    out.push_back({attn("q_b_proj.weight"), {n * m.qk_head_dim(), m.q_lora_rank}});
  } else {
    out.push_back({attn("q_proj.weight"), {n * m.qk_head_dim(), H}});
  }
  out.push_back({attn("kv_a_proj_with_mqa.weight"), {m.latent_dim(), H}});
  out.push_back({attn("kv_a_layernorm.weight"), {m.kv_lora_rank}});
  out.push_back({attn("kv_b_proj.weight"), {n * m.kv_b_rows_per_head(), m.kv_lora_rank}});
  out.push_back({attn("o_proj.weight"), {H, n * m.v_head_dim}});
  return out;
}

// The attention tensors of layer l, into `out`.
void AttentionSpecs(const ModelConfig& c, int64_t l, std::vector<TensorSpec>* out) {
  const int64_t H = c.hidden_size, Q = c.q_size(), K = c.kv_size();
  auto attn = [&](std::string_view s) { return LayerName(l, Cat("self_attn.", s)); };
  out->push_back({LayerName(l, "input_layernorm.weight"), {H}});
  if (c.mla) {
    for (TensorSpec& t : MlaSpecs(c, l)) out->push_back(std::move(t));
    out->push_back({LayerName(l, "post_attention_layernorm.weight"), {H}});
    return;
  }
  out->push_back({attn("q_proj.weight"), {Q, H}});
  out->push_back({attn("k_proj.weight"), {K, H}});
  out->push_back({attn("v_proj.weight"), {K, H}});
  out->push_back({attn("o_proj.weight"), {H, Q}});
  if (c.qkv_bias) {
    out->push_back({attn("q_proj.bias"), {Q}});
    out->push_back({attn("k_proj.bias"), {K}});
    out->push_back({attn("v_proj.bias"), {K}});
  }
  if (c.o_proj_bias) out->push_back({attn("o_proj.bias"), {H}});
  if (c.qk_norm) {
    out->push_back({attn("q_norm.weight"), {c.head_dim}});
    out->push_back({attn("k_norm.weight"), {c.head_dim}});
  }
  out->push_back({LayerName(l, "post_attention_layernorm.weight"), {H}});
}

// A SwiGLU MLP of width `width` under `prefix` ("mlp.", "mlp.experts.3.").
void SwiGluSpecs(const ModelConfig& c, int64_t l, std::string_view prefix, int64_t width, bool bias,
                 std::vector<TensorSpec>* out) {
  const int64_t H = c.hidden_size;
  for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
    const bool down = std::string_view(p) == "down_proj";
    out->push_back({LayerName(l, Cat(prefix, p, ".weight")),
                    down ? std::vector<int64_t>{H, width} : std::vector<int64_t>{width, H}});
    if (bias) out->push_back({LayerName(l, Cat(prefix, p, ".bias")), {down ? H : width}});
  }
}

// The router, routed experts and shared experts of a sparse layer.
void MoeSpecs(const ModelConfig& c, int64_t l, std::vector<TensorSpec>* out) {
  const MoeConfig& m = *c.moe;
  out->push_back({LayerName(l, "mlp.gate.weight"), {m.num_experts, c.hidden_size}});
  if (m.has_correction_bias()) {
    out->push_back({LayerName(l, "mlp.gate.e_score_correction_bias"), {m.num_experts}});
  }
  for (int64_t e = 0; e < m.num_experts; ++e) {
    SwiGluSpecs(c, l, Cat("mlp.experts.", e, "."), m.intermediate_size, false, out);
  }
  if (m.shared_intermediate_size() > 0) {
    SwiGluSpecs(c, l, "mlp.shared_experts.", m.shared_intermediate_size(), false, out);
  }
}

// Whether a tensor of layer `layer` (>= num_hidden_layers) belongs to the
// multi-token-prediction layers, which are skipped; else the error.
absl::StatusOr<bool> IsMtpLayer(const ModelConfig& c, const Checkpoint& checkpoint,
                                const std::string& name, int64_t layer) {
  if (layer < c.num_hidden_layers + c.num_nextn_predict_layers) return true;
  return absl::InvalidArgumentError(
      Cat(checkpoint.description(), ": tensor \"", name, "\" belongs to layer ", layer,
          " but the config has num_hidden_layers = ", c.num_hidden_layers,
          c.num_nextn_predict_layers > 0 ? Cat(" (and ", c.num_nextn_predict_layers,
                                               " multi-token-prediction layer(s) after them)")
                                         : std::string()));
}

// Binds one SwiGLU MLP (no biases) under `prefix`.
absl::Status BindSwiGlu(Binder& b, int64_t l, std::string_view prefix, int64_t H, int64_t width,
                        ExpertWeights* out) {
  for (absl::Status s : {
           b.BindLinear(LayerName(l, Cat(prefix, "gate_proj.weight")), {width, H}, &out->gate_proj),
           b.BindLinear(LayerName(l, Cat(prefix, "up_proj.weight")), {width, H}, &out->up_proj),
           b.BindLinear(LayerName(l, Cat(prefix, "down_proj.weight")), {H, width}, &out->down_proj),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Expert e's [rows, cols] matrix inside a fused [E, rows, cols] tensor, and
// rows [start, start + len) of it.
absl::StatusOr<TensorView> ExpertSlab(const TensorView& fused, int64_t e, int64_t start,
                                      int64_t len) {
  absl::StatusOr<TensorView> slab = SliceRows(fused, e, 1);
  if (!slab.ok()) return slab.status();
  slab->shape.erase(slab->shape.begin());
  absl::StatusOr<TensorView> rows = SliceRows(*slab, start, len);
  if (rows.ok()) rows->name = Cat(fused.name, "[", e, "][", start, ":", start + len, "]");
  return rows;
}

// The fused layout transformers' Experts modules hold in memory (and some
// conversions save): mlp.experts.gate_up_proj [E, 2J, H] (gate rows first,
// as gate_up.chunk(2) splits them) and mlp.experts.down_proj [E, H, J].
absl::Status BindFusedExperts(const ModelConfig& c, Binder& b, int64_t l, MoeWeights* out) {
  const MoeConfig& m = *c.moe;
  const int64_t E = m.num_experts, J = m.intermediate_size, H = c.hidden_size;
  TensorView gate_up, down;
  if (absl::Status s = b.Bind(LayerName(l, "mlp.experts.gate_up_proj"), {E, 2 * J, H}, &gate_up);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = b.Bind(LayerName(l, "mlp.experts.down_proj"), {E, H, J}, &down); !s.ok()) {
    return s;
  }
  out->experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights& w = out->experts[e];
    for (auto [view, fused, start, len] :
         {std::tuple{&w.gate_proj, &gate_up, int64_t{0}, J}, std::tuple{&w.up_proj, &gate_up, J, J},
          std::tuple{&w.down_proj, &down, int64_t{0}, H}}) {
      absl::StatusOr<TensorView> slab = ExpertSlab(*fused, e, start, len);
      if (!slab.ok()) return slab.status();
      *view = *std::move(slab);
    }
  }
  return absl::OkStatus();
}

absl::Status BindMoe(const ModelConfig& c, Binder& b, int64_t l, MoeWeights* out) {
  const MoeConfig& m = *c.moe;
  const int64_t H = c.hidden_size;
  if (absl::Status s = b.Bind(LayerName(l, "mlp.gate.weight"), {m.num_experts, H}, &out->router);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          b.BindOptional(m.has_correction_bias(), LayerName(l, "mlp.gate.e_score_correction_bias"),
                         {m.num_experts}, &out->correction_bias);
      !s.ok()) {
    return s;
  }
  if (b.Has(LayerName(l, "mlp.experts.gate_up_proj"))) {
    if (absl::Status s = BindFusedExperts(c, b, l, out); !s.ok()) return s;
  } else {
    out->experts.resize(static_cast<size_t>(m.num_experts));
    for (int64_t e = 0; e < m.num_experts; ++e) {
      if (absl::Status s = BindSwiGlu(b, l, Cat("mlp.experts.", e, "."), H, m.intermediate_size,
                                      &out->experts[e]);
          !s.ok()) {
        return s;
      }
    }
  }
  if (m.shared_intermediate_size() == 0) return absl::OkStatus();
  out->shared.emplace();
  return BindSwiGlu(b, l, "mlp.shared_experts.", H, m.shared_intermediate_size(), &*out->shared);
}

absl::Status BindDenseMlp(const ModelConfig& config, Binder& b, int64_t l, LayerWeights* lw);

// Binds MlaSpecs(config, l): norms as plain tensors, projections as linears
// (FP8 where the quantization config says so).
absl::Status BindMla(const ModelConfig& config, Binder& b, int64_t l, LayerWeights* lw) {
  MlaWeights& m = lw->mla.emplace();
  for (TensorSpec& t : MlaSpecs(config, l)) {
    const std::string_view name(t.name);
    const std::string_view leaf = name.substr(name.find("self_attn.") + 10);
    auto optional_slot = [&](std::optional<TensorView>* slot) {
      slot->emplace();
      return &**slot;
    };
    TensorView* out = nullptr;
    if (leaf == "q_proj.weight") out = optional_slot(&m.q_proj);
    if (leaf == "q_a_proj.weight") out = optional_slot(&m.q_a_proj);
    if (leaf == "q_a_layernorm.weight") out = optional_slot(&m.q_a_layernorm);
    if (leaf == "q_b_proj.weight") out = optional_slot(&m.q_b_proj);
    if (leaf == "kv_a_proj_with_mqa.weight") out = &m.kv_a_proj_with_mqa;
    if (leaf == "kv_a_layernorm.weight") out = &m.kv_a_layernorm;
    if (leaf == "kv_b_proj.weight") out = &m.kv_b_proj;
    if (leaf == "o_proj.weight") out = &lw->o_proj;
    const bool norm = leaf.find("layernorm") != std::string_view::npos;
    absl::Status s = norm ? b.Bind(t.name, t.shape, out) : b.BindLinear(t.name, t.shape, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status BindLayer(const ModelConfig& config, Binder& b, int64_t l, LayerWeights* lw) {
  const int64_t H = config.hidden_size;
  const int64_t D = config.head_dim;
  const int64_t Q = config.q_size();
  const int64_t K = config.kv_size();
  auto attn = [&](std::string_view s) { return LayerName(l, Cat("self_attn.", s)); };
  b.set_fp8_sink(&lw->fp8);
  if (config.mla) {
    for (absl::Status s : {
             b.Bind(LayerName(l, "input_layernorm.weight"), {H}, &lw->input_layernorm),
             BindMla(config, b, l, lw),
             b.Bind(LayerName(l, "post_attention_layernorm.weight"), {H},
                    &lw->post_attention_layernorm),
         }) {
      if (!s.ok()) return s;
    }
    if (config.IsSparseLayer(l)) {
      lw->moe.emplace();
      return BindMoe(config, b, l, &*lw->moe);
    }
    return BindDenseMlp(config, b, l, lw);
  }
  for (absl::Status s : {
           b.Bind(LayerName(l, "input_layernorm.weight"), {H}, &lw->input_layernorm),
           b.BindLinear(attn("q_proj.weight"), {Q, H}, &lw->q_proj),
           b.BindLinear(attn("k_proj.weight"), {K, H}, &lw->k_proj),
           b.BindLinear(attn("v_proj.weight"), {K, H}, &lw->v_proj),
           b.BindLinear(attn("o_proj.weight"), {H, Q}, &lw->o_proj),
           b.BindOptional(config.qkv_bias, attn("q_proj.bias"), {Q}, &lw->q_bias),
           b.BindOptional(config.qkv_bias, attn("k_proj.bias"), {K}, &lw->k_bias),
           b.BindOptional(config.qkv_bias, attn("v_proj.bias"), {K}, &lw->v_bias),
           b.BindOptional(config.o_proj_bias, attn("o_proj.bias"), {H}, &lw->o_bias),
           b.BindOptional(config.qk_norm, attn("q_norm.weight"), {D}, &lw->q_norm),
           b.BindOptional(config.qk_norm, attn("k_norm.weight"), {D}, &lw->k_norm),
           b.Bind(LayerName(l, "post_attention_layernorm.weight"), {H},
                  &lw->post_attention_layernorm),
       }) {
    if (!s.ok()) return s;
  }
  if (config.IsSparseLayer(l)) {
    lw->moe.emplace();
    return BindMoe(config, b, l, &*lw->moe);
  }
  return BindDenseMlp(config, b, l, lw);
}

absl::Status BindDenseMlp(const ModelConfig& config, Binder& b, int64_t l, LayerWeights* lw) {
  const int64_t H = config.hidden_size;
  const int64_t I = config.intermediate_size;
  auto mlp = [&](std::string_view s) { return LayerName(l, Cat("mlp.", s)); };
  for (absl::Status s : {
           b.BindLinear(mlp("gate_proj.weight"), {I, H}, &lw->gate_proj),
           b.BindLinear(mlp("up_proj.weight"), {I, H}, &lw->up_proj),
           b.BindLinear(mlp("down_proj.weight"), {H, I}, &lw->down_proj),
           b.BindOptional(config.mlp_bias, mlp("gate_proj.bias"), {I}, &lw->gate_bias),
           b.BindOptional(config.mlp_bias, mlp("up_proj.bias"), {I}, &lw->up_bias),
           b.BindOptional(config.mlp_bias, mlp("down_proj.bias"), {H}, &lw->down_bias),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  std::vector<TensorSpec> out = {{"model.embed_tokens.weight", {V, H}}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    AttentionSpecs(c, l, &out);
    if (c.IsSparseLayer(l)) {
      MoeSpecs(c, l, &out);
    } else {
      SwiGluSpecs(c, l, "mlp.", c.intermediate_size, c.mlp_bias, &out);
    }
  }
  out.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, H}});
  return out;
}

std::vector<std::string> RequiredTensorNames(const ModelConfig& config) {
  std::vector<std::string> names;
  for (TensorSpec& t : RequiredTensors(config)) names.push_back(std::move(t.name));
  return names;
}

absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config,
                                              const Checkpoint& checkpoint) {
  const int64_t H = config.hidden_size;
  const int64_t V = config.vocab_size;
  ModelWeights w;
  // A checkpoint with more layers than the config is a mismatch, not spare
  // data; only the multi-token-prediction layers are expected there.
  for (const std::string& name : checkpoint.TensorNames()) {
    const int64_t layer = LayerIndexOf(name);
    if (layer < config.num_hidden_layers) continue;
    absl::StatusOr<bool> mtp = IsMtpLayer(config, checkpoint, name, layer);
    if (!mtp.ok()) return mtp.status();
    w.skipped_tensors.push_back(name);
  }
  std::sort(w.skipped_tensors.begin(), w.skipped_tensors.end());
  if (!w.skipped_tensors.empty()) {
    Log(LogLevel::kInfo, "skipping the multi-token-prediction layers (not run)",
        {{"checkpoint", checkpoint.description()},
         {"layers", Cat("[", config.num_hidden_layers, ", ",
                        config.num_hidden_layers + config.num_nextn_predict_layers, ")")},
         {"tensors", w.skipped_tensors.size()}});
  }

  Binder b(config, checkpoint);
  if (absl::Status s = b.Bind("model.embed_tokens.weight", {V, H}, &w.embed_tokens); !s.ok()) {
    return s;
  }
  w.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (absl::Status s = BindLayer(config, b, l, &w.layers[l]); !s.ok()) return s;
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
    if (!b.Used(name) && LayerIndexOf(name) < config.num_hidden_layers) {
      w.unused_tensors.push_back(name);
    }
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
