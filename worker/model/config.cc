#include "worker/model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "base/json.h"
#include "base/str_cat.h"
#include "worker/model/deepseek_v3_config.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

struct ArchitectureInfo {
  ModelArchitecture arch;
  std::string_view class_name;
  std::string_view model_type;
  int64_t default_max_position_embeddings;  // transformers' config default
};

constexpr ArchitectureInfo kArchitectures[] = {
    {ModelArchitecture::kLlama, "LlamaForCausalLM", "llama", 2048},
    {ModelArchitecture::kMistral, "MistralForCausalLM", "mistral", 4096 * 32},
    {ModelArchitecture::kQwen2, "Qwen2ForCausalLM", "qwen2", 32768},
    {ModelArchitecture::kQwen3, "Qwen3ForCausalLM", "qwen3", 32768},
    {ModelArchitecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", 32768},
    {ModelArchitecture::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe", 131072},
    {ModelArchitecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3", 4096},
};

// Kimi K2 ships DeepseekV3ForCausalLM under its own model_type.
constexpr std::string_view kKimiK2ModelType = "kimi_k2";

// Far above any released model (DeepSeek-V3 and Kimi K2 route over 256 and
// 384 experts), so a corrupt config cannot size absurd tables.
constexpr int64_t kMaxExperts = int64_t{1} << 16;

const ArchitectureInfo& InfoOf(ModelArchitecture arch) {
  for (const ArchitectureInfo& info : kArchitectures) {
    if (info.arch == arch) return info;
  }
  return kArchitectures[0];
}

std::string Brief(const Json& value) {
  std::string text = value.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (text.size() > 48) text = Cat(text.substr(0, 45), "...");
  return text;
}

absl::Status WrongType(std::string_view key, std::string_view want, const Json& value) {
  return absl::InvalidArgumentError(
      Cat(key, " must be ", want, ", got ", JsonTypeName(value), " ", Brief(value)));
}

const Json* Lookup(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// Absent or null -> nullopt. `key` is the name used in messages.
absl::StatusOr<std::optional<int64_t>> OptInt(const Json& obj, std::string_view key,
                                              std::string_view display = {}) {
  if (display.empty()) display = key;
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(Cat(display, " = ", Brief(*v), " is too large"));
    }
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  return WrongType(display, "an integer", *v);
}

absl::StatusOr<std::optional<double>> OptNumber(const Json& obj, std::string_view key,
                                                std::string_view display = {}) {
  if (display.empty()) display = key;
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return WrongType(display, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) {
    return absl::InvalidArgumentError(Cat(display, " must be finite"));
  }
  return d;
}

absl::StatusOr<std::optional<bool>> OptBool(const Json& obj, std::string_view key) {
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "true or false", *v);
  return v->get<bool>();
}

absl::StatusOr<std::optional<std::string>> OptString(const Json& obj, std::string_view key) {
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return WrongType(key, "a string", *v);
  return v->get<std::string>();
}

absl::Status CheckRange(std::string_view key, int64_t v, int64_t min, int64_t max) {
  if (v < min) return absl::InvalidArgumentError(Cat(key, " = ", v, " must be >= ", min));
  if (v > max) {
    return absl::InvalidArgumentError(
        Cat(key, " = ", v, " exceeds the limit of ", max, " (corrupt config?)"));
  }
  return absl::OkStatus();
}

// A required integer in [min, max].
absl::Status RequiredInt(const Json& obj, std::string_view key, int64_t min, int64_t max,
                         int64_t* out) {
  absl::StatusOr<std::optional<int64_t>> v = OptInt(obj, key);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return absl::InvalidArgumentError(Cat("missing required ", key));
  if (absl::Status s = CheckRange(key, **v, min, max); !s.ok()) return s;
  *out = **v;
  return absl::OkStatus();
}

// An optional integer in [min, max], keeping *out when absent.
absl::Status OptionalInt(const Json& obj, std::string_view key, int64_t min, int64_t max,
                         int64_t* out) {
  absl::StatusOr<std::optional<int64_t>> v = OptInt(obj, key);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return absl::OkStatus();
  if (absl::Status s = CheckRange(key, **v, min, max); !s.ok()) return s;
  *out = **v;
  return absl::OkStatus();
}

// An optional number > 0 (finite), keeping *out when absent.
absl::Status OptionalPositive(const Json& obj, std::string_view key, std::string_view display,
                              double* out) {
  absl::StatusOr<std::optional<double>> v = OptNumber(obj, key, display);
  if (!v.ok()) return v.status();
  if (!v->has_value()) return absl::OkStatus();
  if (!(**v > 0)) {
    return absl::InvalidArgumentError(Cat(display, " = ", **v, " must be > 0"));
  }
  *out = **v;
  return absl::OkStatus();
}

absl::Status OptionalBool(const Json& obj, std::string_view key, bool* out) {
  absl::StatusOr<std::optional<bool>> v = OptBool(obj, key);
  if (!v.ok()) return v.status();
  if (v->has_value()) *out = **v;
  return absl::OkStatus();
}

absl::StatusOr<ModelArchitecture> ParseArchitecture(const Json& obj, std::string* model_type) {
  std::string names;
  for (const ArchitectureInfo& info : kArchitectures) {
    names += Cat(names.empty() ? "" : ", ", info.class_name);
  }
  absl::StatusOr<std::optional<std::string>> type = OptString(obj, "model_type");
  if (!type.ok()) return type.status();
  if (const Json* archs = Lookup(obj, "architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return WrongType("architectures", "a non-empty list of class names", *archs);
    }
    if (archs->size() > 1) {
      return absl::InvalidArgumentError(
          Cat("architectures lists ", archs->size(), " classes; expected exactly one"));
    }
    const std::string& name = (*archs)[0].get_ref<const std::string&>();
    for (const ArchitectureInfo& info : kArchitectures) {
      if (info.class_name == name) {
        *model_type = type->value_or(std::string(info.model_type));
        return info.arch;
      }
    }
    return absl::InvalidArgumentError(
        Cat("architecture \"", name, "\" is not supported (supported: ", names, ")"));
  }
  if (type->has_value()) {
    if (**type == kKimiK2ModelType) {
      *model_type = **type;
      return ModelArchitecture::kDeepseekV3;
    }
    for (const ArchitectureInfo& info : kArchitectures) {
      if (info.model_type == **type) {
        *model_type = **type;
        return info.arch;
      }
    }
    std::string types;
    for (const ArchitectureInfo& info : kArchitectures) {
      types += Cat(types.empty() ? "" : ", ", info.model_type);
    }
    return absl::InvalidArgumentError(
        Cat("model_type \"", **type, "\" is not supported (supported: ", types, ")"));
  }
  return absl::InvalidArgumentError(
      Cat("neither architectures nor model_type is given (supported: ", names, ")"));
}

// YaRN's keys (transformers' _compute_yarn_parameters): factor (>= 1,
// required), original_max_position_embeddings (0 when absent: the model's
// max_position_embeddings, filled in later), beta_fast / beta_slow (32 / 1,
// also when 0, as transformers' `or`), mscale, mscale_all_dim (absent = 0),
// attention_factor, truncate (true).
absl::StatusOr<RopeScaling> ParseYarn(const Json& obj, std::string_view prefix) {
  RopeScaling y;
  y.type = RopeScalingType::kYarn;
  auto display = [&](std::string_view key) { return Cat(prefix, ".", key); };
  absl::StatusOr<std::optional<double>> factor = OptNumber(obj, "factor", display("factor"));
  if (!factor.ok()) return factor.status();
  if (!factor->has_value()) {
    return absl::InvalidArgumentError(
        Cat(display("factor"), " is required for rope type \"yarn\""));
  }
  y.factor = **factor;
  if (!(y.factor >= 1.0)) {
    return absl::InvalidArgumentError(Cat(display("factor"), " = ", y.factor, " must be >= 1"));
  }
  absl::StatusOr<std::optional<int64_t>> original =
      OptInt(obj, "original_max_position_embeddings", display("original_max_position_embeddings"));
  if (!original.ok()) return original.status();
  if (original->has_value()) {
    if (**original < 1) {
      return absl::InvalidArgumentError(
          Cat(display("original_max_position_embeddings"), " must be a positive integer"));
    }
    y.original_max_position_embeddings = **original;
  }
  for (auto [key, out] :
       {std::pair{"beta_fast", &y.beta_fast}, std::pair{"beta_slow", &y.beta_slow},
        std::pair{"mscale", &y.mscale}, std::pair{"mscale_all_dim", &y.mscale_all_dim}}) {
    absl::StatusOr<std::optional<double>> v = OptNumber(obj, key, display(key));
    if (!v.ok()) return v.status();
    if (v->has_value() && **v != 0) *out = **v;
  }
  if (!(y.beta_fast > 0) || !(y.beta_slow > 0)) {
    return absl::InvalidArgumentError(Cat(prefix, ": yarn beta_fast and beta_slow must be > 0"));
  }
  if (!(y.mscale >= 0) || !(y.mscale_all_dim >= 0)) {
    return absl::InvalidArgumentError(Cat(prefix, ": yarn mscale and mscale_all_dim must be >= 0"));
  }
  absl::StatusOr<std::optional<double>> attention =
      OptNumber(obj, "attention_factor", display("attention_factor"));
  if (!attention.ok()) return attention.status();
  if (attention->has_value()) {
    if (!(**attention > 0)) {
      return absl::InvalidArgumentError(Cat(display("attention_factor"), " must be > 0"));
    }
    y.attention_factor = **attention;
  }
  absl::StatusOr<std::optional<bool>> truncate = OptBool(obj, "truncate");
  if (!truncate.ok()) return truncate.status();
  y.truncate = truncate->value_or(true);
  return y;
}

// Parses a rope_scaling / rope_parameters object. `prefix` is its key.
absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& obj, std::string_view prefix) {
  if (!obj.is_object()) return WrongType(prefix, "an object or null", obj);
  absl::StatusOr<std::optional<std::string>> rope_type = OptString(obj, "rope_type");
  if (!rope_type.ok()) return rope_type.status();
  absl::StatusOr<std::optional<std::string>> legacy_type = OptString(obj, "type");
  if (!legacy_type.ok()) return legacy_type.status();
  std::string type = rope_type->value_or(legacy_type->value_or("default"));

  RopeScaling scaling;
  auto display = [&](std::string_view key) { return Cat(prefix, ".", key); };
  auto number = [&](std::string_view key, double* out) -> absl::Status {
    absl::StatusOr<std::optional<double>> v = OptNumber(obj, key, display(key));
    if (!v.ok()) return v.status();
    if (!v->has_value()) {
      return absl::InvalidArgumentError(
          Cat(display(key), " is required for rope type \"", type, "\""));
    }
    *out = **v;
    return absl::OkStatus();
  };
  if (type == "default") return scaling;
  if (type == "linear" || type == "llama3") {
    if (absl::Status s = number("factor", &scaling.factor); !s.ok()) return s;
    if (!(scaling.factor >= 1.0)) {
      return absl::InvalidArgumentError(
          Cat(display("factor"), " = ", scaling.factor, " must be >= 1"));
    }
  }
  if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    return scaling;
  }
  if (type == "llama3") {
    scaling.type = RopeScalingType::kLlama3;
    if (absl::Status s = number("low_freq_factor", &scaling.low_freq_factor); !s.ok()) return s;
    if (absl::Status s = number("high_freq_factor", &scaling.high_freq_factor); !s.ok()) return s;
    if (!(scaling.low_freq_factor > 0) || !(scaling.high_freq_factor > scaling.low_freq_factor)) {
      return absl::InvalidArgumentError(
          Cat(prefix, ": llama3 scaling needs 0 < low_freq_factor < high_freq_factor, got ",
              scaling.low_freq_factor, " and ", scaling.high_freq_factor));
    }
    absl::StatusOr<std::optional<int64_t>> original = OptInt(
        obj, "original_max_position_embeddings", display("original_max_position_embeddings"));
    if (!original.ok()) return original.status();
    if (!original->has_value() || **original < 1) {
      return absl::InvalidArgumentError(
          Cat(display("original_max_position_embeddings"),
              " must be a positive integer for rope type \"llama3\""));
    }
    scaling.original_max_position_embeddings = **original;
    return scaling;
  }
  if (type == "yarn") return ParseYarn(obj, prefix);
  return absl::InvalidArgumentError(Cat(prefix, " type \"", type,
                                        "\" is not supported (supported: default, linear, llama3, "
                                        "yarn)"));
}

absl::Status ParseSlidingWindow(const Json& obj, ModelConfig* config) {
  absl::StatusOr<std::optional<int64_t>> window = OptInt(obj, "sliding_window");
  if (!window.ok()) return window.status();
  const int64_t layers = config->num_hidden_layers;
  int64_t sliding_layers = 0;
  if (const Json* types = Lookup(obj, "layer_types")) {
    // Newer transformers: an explicit per-layer list.
    if (!types->is_array() || static_cast<int64_t>(types->size()) != layers) {
      return WrongType("layer_types", Cat("a list of ", layers, " layer types"), *types);
    }
    for (const Json& t : *types) {
      if (t == "sliding_attention") {
        ++sliding_layers;
      } else if (t != "full_attention") {
        return absl::InvalidArgumentError(
            Cat("layer_types entry ", Brief(t),
                " is not supported (supported: full_attention, sliding_attention)"));
      }
    }
  } else if (config->architecture == ModelArchitecture::kMistral) {
    sliding_layers = window->has_value() ? layers : 0;
  } else if (config->architecture == ModelArchitecture::kQwen2 ||
             config->architecture == ModelArchitecture::kQwen3 ||
             config->architecture == ModelArchitecture::kQwen3Moe) {
    bool use_sliding_window = false;
    if (absl::Status s = OptionalBool(obj, "use_sliding_window", &use_sliding_window); !s.ok()) {
      return s;
    }
    if (use_sliding_window) {
      int64_t max_window_layers = layers;
      if (absl::Status s = OptionalInt(obj, "max_window_layers", 0, INT64_MAX, &max_window_layers);
          !s.ok()) {
        return s;
      }
      sliding_layers = std::max<int64_t>(0, layers - max_window_layers);
    }
  }
  if (sliding_layers == 0) return absl::OkStatus();
  if (!window->has_value() || **window < 1) {
    return absl::InvalidArgumentError(
        "sliding-window attention is enabled but sliding_window is not a positive integer");
  }
  config->sliding_window = **window;
  config->sliding_window_layers = sliding_layers;
  return absl::OkStatus();
}

absl::Status ParseTokenIds(const Json& obj, ModelConfig* config) {
  absl::StatusOr<std::optional<int64_t>> bos = OptInt(obj, "bos_token_id");
  if (!bos.ok()) return bos.status();
  config->bos_token_id = *bos;
  if (const Json* eos = Lookup(obj, "eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        const Json& id = (*eos)[i];
        if (!id.is_number_integer()) {
          return WrongType(Cat("eos_token_id[", i, "]"), "an integer", id);
        }
        config->eos_token_ids.push_back(
            id.is_number_unsigned()
                ? static_cast<int64_t>(std::min<uint64_t>(id.get<uint64_t>(), INT64_MAX))
                : id.get<int64_t>());
      }
    } else if (eos->is_number_integer()) {
      absl::StatusOr<std::optional<int64_t>> one = OptInt(obj, "eos_token_id");
      if (!one.ok()) return one.status();
      config->eos_token_ids.push_back(**one);
    } else {
      return WrongType("eos_token_id", "an integer or a list of integers", *eos);
    }
  }
  auto check = [&](std::string_view key, int64_t id) -> absl::Status {
    if (id < 0 || id >= config->vocab_size) {
      return absl::InvalidArgumentError(
          Cat(key, " = ", id, " is outside the vocabulary [0, ", config->vocab_size, ")"));
    }
    return absl::OkStatus();
  };
  if (config->bos_token_id.has_value()) {
    if (absl::Status s = check("bos_token_id", *config->bos_token_id); !s.ok()) return s;
  }
  for (int64_t id : config->eos_token_ids) {
    if (absl::Status s = check("eos_token_id", id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The routed-expert count: `key`, or num_local_experts (transformers 5
// writes that name for Qwen3-MoE; real checkpoints use `key`). When both are
// given they must agree.
absl::Status ExpertCount(const Json& obj, std::string_view key, int64_t* out) {
  absl::StatusOr<std::optional<int64_t>> named = OptInt(obj, key);
  if (!named.ok()) return named.status();
  absl::StatusOr<std::optional<int64_t>> local = OptInt(obj, "num_local_experts");
  if (!local.ok()) return local.status();
  if (named->has_value() && local->has_value() && **named != **local) {
    return absl::InvalidArgumentError(
        Cat(key, " = ", **named, " and num_local_experts = ", **local, " disagree"));
  }
  const std::string_view display =
      named->has_value() || !local->has_value() ? key : std::string_view("num_local_experts");
  if (named->has_value() || local->has_value()) {
    *out = named->has_value() ? **named : **local;
  }
  return CheckRange(display, *out, 0, kMaxExperts);
}

// Keys both MoE architectures share (defaults already in *m).
absl::Status ParseCommonMoe(const Json& obj, MoeConfig* m) {
  if (absl::Status s = OptionalInt(obj, "num_experts_per_tok", 1, kMaxExperts, &m->top_k);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          OptionalInt(obj, "moe_intermediate_size", 1, kMaxIntermediateSize, &m->intermediate_size);
      !s.ok()) {
    return s;
  }
  return OptionalBool(obj, "norm_topk_prob", &m->norm_topk_prob);
}

// mlp_only_layers: absent or null -> none; else integers in [0, layers).
absl::StatusOr<std::vector<int64_t>> MlpOnlyLayers(const Json& obj, int64_t layers) {
  std::vector<int64_t> out;
  const Json* list = Lookup(obj, "mlp_only_layers");
  if (list == nullptr) return out;
  if (!list->is_array()) return WrongType("mlp_only_layers", "a list of layer indices", *list);
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& v = (*list)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers) {
      return absl::InvalidArgumentError(Cat("mlp_only_layers[", i, "] = ", Brief(v),
                                            " is not a layer index in [0, ", layers, ")"));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// Qwen3MoeDecoderLayer's choice: sparse unless listed in mlp_only_layers,
// and only every decoder_sparse_step-th layer (1-based).
absl::Status ParseQwen3Moe(const Json& obj, ModelConfig* c) {
  MoeConfig m;
  m.scoring = MoeScoring::kSoftmax;
  m.num_experts = 128;
  m.top_k = 8;
  m.intermediate_size = 768;
  m.norm_topk_prob = false;
  if (absl::Status s = ExpertCount(obj, "num_experts", &m.num_experts); !s.ok()) return s;
  if (absl::Status s = ParseCommonMoe(obj, &m); !s.ok()) return s;
  int64_t step = 1;
  if (absl::Status s = OptionalInt(obj, "decoder_sparse_step", 1, kMaxLayers, &step); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<int64_t>> dense = MlpOnlyLayers(obj, c->num_hidden_layers);
  if (!dense.ok()) return dense.status();
  m.sparse_layers.assign(static_cast<size_t>(c->num_hidden_layers), false);
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    const bool listed = std::find(dense->begin(), dense->end(), l) != dense->end();
    m.sparse_layers[l] = !listed && m.num_experts > 0 && (l + 1) % step == 0;
  }
  c->moe = std::move(m);
  return absl::OkStatus();
}

// The defaults of the sigmoid-grouped MoE keys, per architecture.
struct GroupedMoeDefaults {
  MoeConfig moe;
  int64_t first_k_dense_replace = 1;
  int64_t num_nextn_predict_layers = 1;
};

GroupedMoeDefaults Glm4MoeDefaults() {
  GroupedMoeDefaults d;
  d.moe.num_experts = 128;
  d.moe.top_k = 8;
  d.moe.intermediate_size = 1408;
  d.moe.num_shared_experts = 1;
  return d;
}

// transformers' DeepseekV3Config defaults (its config has no
// num_nextn_predict_layers; real checkpoints that store an MTP layer say so).
GroupedMoeDefaults DeepseekV3MoeDefaults() {
  GroupedMoeDefaults d;
  d.moe.num_experts = 256;
  d.moe.top_k = 8;
  d.moe.intermediate_size = 2048;
  d.moe.num_shared_experts = 1;
  d.moe.n_group = 8;
  d.moe.topk_group = 4;
  d.moe.routed_scaling_factor = 2.5;
  d.first_k_dense_replace = 3;
  d.num_nextn_predict_layers = 0;
  return d;
}

// Glm4MoeDecoderLayer's (and DeepseekV3DecoderLayer's) choice: the first
// first_k_dense_replace layers dense.
absl::Status ParseGroupedMoe(const Json& obj, const GroupedMoeDefaults& defaults, ModelConfig* c) {
  MoeConfig m = defaults.moe;
  m.scoring = MoeScoring::kSigmoidGrouped;
  m.norm_topk_prob = true;
  if (absl::Status s = ExpertCount(obj, "n_routed_experts", &m.num_experts); !s.ok()) return s;
  if (absl::Status s = ParseCommonMoe(obj, &m); !s.ok()) return s;
  for (auto [key, out] :
       {std::pair{"n_shared_experts", &m.num_shared_experts}, std::pair{"n_group", &m.n_group},
        std::pair{"topk_group", &m.topk_group}}) {
    const int64_t min = std::string_view(key) == "n_shared_experts" ? 0 : 1;
    if (absl::Status s = OptionalInt(obj, key, min, kMaxExperts, out); !s.ok()) return s;
  }
  if (absl::Status s = OptionalPositive(obj, "routed_scaling_factor", "routed_scaling_factor",
                                        &m.routed_scaling_factor);
      !s.ok()) {
    return s;
  }
  int64_t first_dense = defaults.first_k_dense_replace;
  if (absl::Status s =
          OptionalInt(obj, "first_k_dense_replace", 0, c->num_hidden_layers, &first_dense);
      !s.ok()) {
    return s;
  }
  m.sparse_layers.assign(static_cast<size_t>(c->num_hidden_layers), false);
  for (int64_t l = first_dense; l < c->num_hidden_layers; ++l) m.sparse_layers[l] = true;
  c->num_nextn_predict_layers = defaults.num_nextn_predict_layers;
  if (absl::Status s =
          OptionalInt(obj, "num_nextn_predict_layers", 0, kMaxLayers, &c->num_nextn_predict_layers);
      !s.ok()) {
    return s;
  }
  c->moe = std::move(m);
  return absl::OkStatus();
}

// The routing constraints both schemes need to be well defined.
absl::Status ValidateMoe(const MoeConfig& m) {
  const bool any_sparse =
      std::find(m.sparse_layers.begin(), m.sparse_layers.end(), true) != m.sparse_layers.end();
  if (!any_sparse) return absl::OkStatus();  // every layer dense: nothing is routed
  if (m.top_k > m.num_experts) {
    return absl::InvalidArgumentError(Cat("num_experts_per_tok = ", m.top_k,
                                          " exceeds the number of routed experts (", m.num_experts,
                                          ")"));
  }
  if (m.scoring == MoeScoring::kSoftmax) return absl::OkStatus();
  if (m.num_experts % m.n_group != 0) {
    return absl::InvalidArgumentError(
        Cat("n_group = ", m.n_group, " does not divide the ", m.num_experts, " routed experts"));
  }
  if (m.topk_group > m.n_group) {
    return absl::InvalidArgumentError(
        Cat("topk_group = ", m.topk_group, " exceeds n_group = ", m.n_group));
  }
  if (m.group_size() < 2) {
    return absl::InvalidArgumentError(
        Cat("groups of ", m.group_size(), " expert(s) (", m.num_experts, " experts / n_group = ",
            m.n_group, "): a group is scored by its top two experts, so it needs at least 2"));
  }
  if (m.top_k > m.topk_group * m.group_size()) {
    return absl::InvalidArgumentError(Cat("num_experts_per_tok = ", m.top_k,
                                          " exceeds the experts of the topk_group = ", m.topk_group,
                                          " chosen groups (", m.topk_group * m.group_size(), ")"));
  }
  return absl::OkStatus();
}

// GLM-4.5's partial rotary factor: top level or inside rope_parameters
// (transformers 5 moves it there), default 0.5 as Glm4MoeConfig.
absl::Status ParsePartialRotary(const Json& obj, ModelConfig* c) {
  double factor = 0.5;
  if (const Json* params = Lookup(obj, "rope_parameters"); params && params->is_object()) {
    if (absl::Status s = OptionalPositive(*params, "partial_rotary_factor",
                                          "rope_parameters.partial_rotary_factor", &factor);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s =
          OptionalPositive(obj, "partial_rotary_factor", "partial_rotary_factor", &factor);
      !s.ok()) {
    return s;
  }
  if (factor > 1.0) {
    return absl::InvalidArgumentError(Cat("partial_rotary_factor = ", factor, " must be <= 1"));
  }
  c->partial_rotary_factor = factor;
  const int64_t dim = c->rotary_dim();
  if (dim < 2 || dim % 2 != 0) {
    return absl::InvalidArgumentError(Cat("partial_rotary_factor = ", factor, " gives ", dim,
                                          " rotary dims of head_dim ", c->head_dim,
                                          "; RoPE needs an even number >= 2"));
  }
  return absl::OkStatus();
}

// The MoE keys and partial RoPE of the architectures that have them.
absl::Status ParseArchitectureExtras(const Json& obj, ModelConfig* c) {
  if (c->architecture == ModelArchitecture::kQwen3Moe) {
    if (absl::Status s = ParseQwen3Moe(obj, c); !s.ok()) return s;
  } else if (c->architecture == ModelArchitecture::kGlm4Moe) {
    if (absl::Status s = ParseGroupedMoe(obj, Glm4MoeDefaults(), c); !s.ok()) return s;
    if (absl::Status s = ParsePartialRotary(obj, c); !s.ok()) return s;
  } else if (c->architecture == ModelArchitecture::kDeepseekV3) {
    if (absl::Status s = ParseGroupedMoe(obj, DeepseekV3MoeDefaults(), c); !s.ok()) return s;
    if (absl::Status s = ParseDeepseekV3Extras(obj, c); !s.ok()) return s;
  }
  if (c->rope_scaling.type == RopeScalingType::kYarn &&
      c->architecture != ModelArchitecture::kDeepseekV3) {
    return absl::InvalidArgumentError(
        Cat("rope type \"yarn\" is supported for DeepseekV3ForCausalLM only (not ",
            ArchitectureName(c->architecture), ")"));
  }
  return c->moe ? ValidateMoe(*c->moe) : absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseConfigObject(const Json& obj) {
  if (!obj.is_object()) return WrongType("config", "a JSON object", obj);
  ModelConfig config;
  absl::StatusOr<ModelArchitecture> arch = ParseArchitecture(obj, &config.model_type);
  if (!arch.ok()) return arch.status();
  config.architecture = *arch;
  const ArchitectureInfo& info = InfoOf(config.architecture);

  struct Dimension {
    const char* key;
    int64_t max;
    int64_t* out;
  };
  for (const Dimension& d :
       {Dimension{"vocab_size", kMaxVocabSize, &config.vocab_size},
        Dimension{"hidden_size", kMaxHiddenSize, &config.hidden_size},
        Dimension{"intermediate_size", kMaxIntermediateSize, &config.intermediate_size},
        Dimension{"num_hidden_layers", kMaxLayers, &config.num_hidden_layers},
        Dimension{"num_attention_heads", kMaxHeads, &config.num_attention_heads}}) {
    if (absl::Status s = RequiredInt(obj, d.key, 1, d.max, d.out); !s.ok()) return s;
  }
  config.num_key_value_heads = config.num_attention_heads;
  if (absl::Status s =
          OptionalInt(obj, "num_key_value_heads", 1, kMaxHeads, &config.num_key_value_heads);
      !s.ok()) {
    return s;
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        Cat("num_attention_heads = ", config.num_attention_heads,
            " is not a multiple of num_key_value_heads = ", config.num_key_value_heads));
  }
  absl::StatusOr<std::optional<int64_t>> head_dim = OptInt(obj, "head_dim");
  if (!head_dim.ok()) return head_dim.status();
  if (head_dim->has_value()) {
    config.head_dim = **head_dim;
    if (absl::Status s = CheckRange("head_dim", config.head_dim, 1, kMaxHeadDim); !s.ok()) {
      return s;
    }
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      return absl::InvalidArgumentError(
          Cat("hidden_size = ", config.hidden_size, " is not a multiple of num_attention_heads = ",
              config.num_attention_heads, " and no head_dim is given"));
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
    if (absl::Status s = CheckRange("head_dim", config.head_dim, 1, kMaxHeadDim); !s.ok()) {
      return s;
    }
  }
  if (config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        Cat("head_dim = ", config.head_dim, " must be even for rotary embeddings"));
  }

  if (absl::Status s = OptionalPositive(obj, "rms_norm_eps", "rms_norm_eps", &config.rms_norm_eps);
      !s.ok()) {
    return s;
  }
  config.max_position_embeddings = info.default_max_position_embeddings;
  if (absl::Status s = OptionalInt(obj, "max_position_embeddings", 1, kMaxPositionEmbeddings,
                                   &config.max_position_embeddings);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = OptionalBool(obj, "tie_word_embeddings", &config.tie_word_embeddings);
      !s.ok()) {
    return s;
  }

  // RoPE: rope_theta + rope_scaling, or the newer rope_parameters object.
  if (absl::Status s = OptionalPositive(obj, "rope_theta", "rope_theta", &config.rope_theta);
      !s.ok()) {
    return s;
  }
  if (const Json* scaling = Lookup(obj, "rope_scaling")) {
    absl::StatusOr<RopeScaling> parsed = ParseRopeScaling(*scaling, "rope_scaling");
    if (!parsed.ok()) return parsed.status();
    config.rope_scaling = *parsed;
  } else if (const Json* params = Lookup(obj, "rope_parameters")) {
    absl::StatusOr<RopeScaling> parsed = ParseRopeScaling(*params, "rope_parameters");
    if (!parsed.ok()) return parsed.status();
    config.rope_scaling = *parsed;
    if (absl::Status s = OptionalPositive(*params, "rope_theta", "rope_parameters.rope_theta",
                                          &config.rope_theta);
        !s.ok()) {
      return s;
    }
  }

  absl::StatusOr<std::optional<std::string>> act = OptString(obj, "hidden_act");
  if (!act.ok()) return act.status();
  if (act->has_value() && **act != "silu") {
    return absl::InvalidArgumentError(
        Cat("hidden_act \"", **act, "\" is not supported (supported: silu)"));
  }

  bool attention_bias = false;
  bool mlp_bias = false;
  if (absl::Status s = OptionalBool(obj, "attention_bias", &attention_bias); !s.ok()) return s;
  if (absl::Status s = OptionalBool(obj, "mlp_bias", &mlp_bias); !s.ok()) return s;
  switch (config.architecture) {
    case ModelArchitecture::kLlama:
      config.qkv_bias = config.o_proj_bias = attention_bias;
      config.mlp_bias = mlp_bias;
      break;
    case ModelArchitecture::kMistral:
      break;
    case ModelArchitecture::kQwen2:
      config.qkv_bias = true;
      break;
    case ModelArchitecture::kQwen3:
    case ModelArchitecture::kQwen3Moe:
      config.qkv_bias = config.o_proj_bias = attention_bias;
      config.qk_norm = true;
      break;
    case ModelArchitecture::kGlm4Moe:
      config.qkv_bias = attention_bias;  // Glm4MoeAttention: o_proj never has a bias
      if (absl::Status s = OptionalBool(obj, "use_qk_norm", &config.qk_norm); !s.ok()) return s;
      break;
    case ModelArchitecture::kDeepseekV3:
      break;  // MLA projections: deepseek_v3_config.h (attention_bias refused there)
  }
  if (absl::Status s = ParseArchitectureExtras(obj, &config); !s.ok()) return s;

  absl::StatusOr<std::optional<std::string>> dtype = OptString(obj, "torch_dtype");
  if (!dtype.ok()) return dtype.status();
  if (!dtype->has_value()) {
    dtype = OptString(obj, "dtype");
    if (!dtype.ok()) return dtype.status();
  }
  if (dtype->has_value()) {
    absl::StatusOr<DType> parsed = ParseTorchDType(**dtype);
    if (!parsed.ok()) return parsed.status();
    config.torch_dtype = *parsed;
  }

  if (absl::Status s = ParseTokenIds(obj, &config); !s.ok()) return s;
  if (absl::Status s = ParseSlidingWindow(obj, &config); !s.ok()) return s;
  absl::StatusOr<std::optional<QuantizationConfig>> quantization = ParseQuantizationConfig(obj);
  if (!quantization.ok()) return quantization.status();
  config.quantization = *std::move(quantization);
  return config;
}

}  // namespace

std::string_view ArchitectureName(ModelArchitecture arch) { return InfoOf(arch).class_name; }

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source) {
  absl::StatusOr<Json> json = ParseJsonStrict(json_text);
  absl::StatusOr<ModelConfig> config =
      json.ok() ? ParseConfigObject(*json) : absl::StatusOr<ModelConfig>(json.status());
  if (!config.ok()) {
    return absl::Status(config.status().code(), Cat(source, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::string file = path;
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = Cat(path, path.ends_with('/') ? "" : "/", "config.json");
  }
  absl::StatusOr<Json> json = ReadJsonFile(file);
  if (!json.ok()) return json.status();
  absl::StatusOr<ModelConfig> config = ParseConfigObject(*json);
  if (!config.ok()) {
    return absl::Status(config.status().code(), Cat(file, ": ", config.status().message()));
  }
  return config;
}

absl::Status CheckContextLength(const ModelConfig& config, int64_t max_model_len) {
  if (max_model_len < 1) {
    return absl::InvalidArgumentError(Cat("max_model_len = ", max_model_len, " must be >= 1"));
  }
  if (max_model_len > config.max_position_embeddings) {
    return absl::FailedPreconditionError(
        Cat("max_model_len = ", max_model_len,
            " exceeds the model's max_position_embeddings = ", config.max_position_embeddings));
  }
  if (config.sliding_window.has_value() && max_model_len > *config.sliding_window) {
    return absl::FailedPreconditionError(
        Cat("the model uses sliding-window attention (sliding_window = ", *config.sliding_window,
            " on ", config.sliding_window_layers, " of ", config.num_hidden_layers,
            " layers), which Tessera does not implement; full attention matches it only for "
            "sequences of at most ",
            *config.sliding_window, " tokens: set max_model_len <= ", *config.sliding_window));
  }
  return absl::OkStatus();
}

}  // namespace tessera::model
