#include "worker/model/quantization.h"

#include <cmath>
#include <regex>
#include <utility>

#include "base/json.h"
#include "base/str_cat.h"
#include "kernels/cpu/fp8_e4m3.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kPrefix = "quantization_config.";

absl::Status Invalid(std::string_view key, std::string_view problem) {
  return absl::InvalidArgumentError(Cat(kPrefix, key, " ", problem));
}

absl::Status Unsupported(std::string_view key, std::string_view problem) {
  return absl::UnimplementedError(Cat(kPrefix, key, " ", problem));
}

std::string Brief(const Json& v) {
  std::string text = v.dump(-1, ' ', true, Json::error_handler_t::replace);
  return text.size() > 60 ? Cat(text.substr(0, 57), "...") : text;
}

const Json* Lookup(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::optional<std::string>> OptString(const Json& obj, std::string_view key,
                                                     std::string_view display) {
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return Invalid(display, Cat("must be a string, got ", Brief(*v)));
  return v->get<std::string>();
}

absl::StatusOr<std::vector<std::string>> StringList(const Json& obj, std::string_view key,
                                                    std::string_view display) {
  std::vector<std::string> out;
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return out;
  if (!v->is_array()) return Invalid(display, Cat("must be a list of strings, got ", Brief(*v)));
  for (const Json& e : *v) {
    if (!e.is_string()) return Invalid(display, Cat("must hold strings, got ", Brief(e)));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// A [rows, cols] block size; only 128 x 128 is implemented.
absl::Status ParseBlock(const Json& v, std::string_view display, int64_t* out, int64_t* in) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer()) {
    return Invalid(display, Cat("must be [rows, cols] of integers, got ", Brief(v)));
  }
  *out = v[0].get<int64_t>();
  *in = v[1].get<int64_t>();
  if (*out < 1 || *in < 1) return Invalid(display, Cat("must be positive, got ", Brief(v)));
  if (*out != kFp8BlockSize || *in != kFp8BlockSize) {
    return Unsupported(display, Cat("= ", Brief(v), ": only [128, 128] blocks are supported"));
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizationConfig> ParseFineGrained(const Json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kFineGrainedFp8;
  absl::StatusOr<std::optional<std::string>> fmt = OptString(q, "fmt", "fmt");
  if (!fmt.ok()) return fmt.status();
  if (fmt->has_value() && **fmt != "e4m3") {
    return Unsupported("fmt", Cat("= \"", **fmt, "\": only e4m3 weights are supported"));
  }
  absl::StatusOr<std::optional<std::string>> scheme =
      OptString(q, "activation_scheme", "activation_scheme");
  if (!scheme.ok()) return scheme.status();
  if (scheme->has_value() && **scheme != "dynamic") {
    return Unsupported("activation_scheme",
                       Cat("= \"", **scheme, "\": fine-grained FP8 needs \"dynamic\""));
  }
  const Json* block = Lookup(q, "weight_block_size");
  if (block == nullptr) {
    return Unsupported(
        "weight_block_size",
        "is missing: per-tensor fine-grained FP8 is not supported (needs [128, 128])");
  }
  if (absl::Status s = ParseBlock(*block, "weight_block_size", &c.block_out, &c.block_in);
      !s.ok()) {
    return s;
  }
  c.weight_strategy = WeightScaleStrategy::kBlock;
  c.activation = ActivationQuant::kDynamicTokenGroup;
  c.activation_group = c.block_in;
  absl::StatusOr<std::vector<std::string>> skip =
      StringList(q, "modules_to_not_convert", "modules_to_not_convert");
  if (!skip.ok()) return skip.status();
  c.unquantized_modules = *std::move(skip);
  return c;
}

// The 8-bit float, symmetric args of a compressed-tensors quantization group.
absl::Status CheckFloat8Args(const Json& args, std::string_view display) {
  if (!args.is_object()) return Invalid(display, Cat("must be an object, got ", Brief(args)));
  const Json* bits = Lookup(args, "num_bits");
  if (bits == nullptr || !bits->is_number_integer() || bits->get<int64_t>() != 8) {
    return Unsupported(Cat(display, ".num_bits"),
                       Cat("= ", bits ? Brief(*bits) : "missing", ": only 8 bits are supported"));
  }
  const Json* type = Lookup(args, "type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "float") {
    return Unsupported(Cat(display, ".type"), Cat("= ", type ? Brief(*type) : "missing",
                                                  ": only \"float\" (FP8 e4m3) is supported"));
  }
  const Json* symmetric = Lookup(args, "symmetric");
  if (symmetric != nullptr && !(symmetric->is_boolean() && symmetric->get<bool>())) {
    return Unsupported(Cat(display, ".symmetric"),
                       Cat("= ", Brief(*symmetric), ": only symmetric quantization"));
  }
  return absl::OkStatus();
}

bool IsTrue(const Json& obj, std::string_view key) {
  const Json* v = Lookup(obj, key);
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

absl::Status ParseWeights(const Json& w, std::string_view display, QuantizationConfig* c) {
  if (absl::Status s = CheckFloat8Args(w, display); !s.ok()) return s;
  if (IsTrue(w, "dynamic")) {
    return Unsupported(Cat(display, ".dynamic"), "= true: weights must carry stored scales");
  }
  absl::StatusOr<std::optional<std::string>> strategy =
      OptString(w, "strategy", Cat(display, ".strategy"));
  if (!strategy.ok()) return strategy.status();
  const std::string s = strategy->value_or("tensor");
  if (s == "tensor") {
    c->weight_strategy = WeightScaleStrategy::kTensor;
  } else if (s == "channel") {
    c->weight_strategy = WeightScaleStrategy::kChannel;
  } else if (s == "block") {
    c->weight_strategy = WeightScaleStrategy::kBlock;
    const Json* block = Lookup(w, "block_structure");
    if (block == nullptr) return Invalid(Cat(display, ".block_structure"), "is missing");
    return ParseBlock(*block, Cat(display, ".block_structure"), &c->block_out, &c->block_in);
  } else {
    return Unsupported(Cat(display, ".strategy"),
                       Cat("= \"", s, "\" (supported: tensor, channel, block)"));
  }
  return absl::OkStatus();
}

absl::Status ParseInputActivations(const Json* a, std::string_view display, QuantizationConfig* c) {
  if (a == nullptr) {
    c->activation = ActivationQuant::kNone;
    return absl::OkStatus();
  }
  if (absl::Status s = CheckFloat8Args(*a, display); !s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> strategy =
      OptString(*a, "strategy", Cat(display, ".strategy"));
  if (!strategy.ok()) return strategy.status();
  const std::string s = strategy->value_or("tensor");
  const bool dynamic = IsTrue(*a, "dynamic");
  if (dynamic && s == "token") {
    c->activation = ActivationQuant::kDynamicToken;
  } else if (dynamic && s == "group") {
    const Json* group = Lookup(*a, "group_size");
    if (group == nullptr || !group->is_number_integer() || group->get<int64_t>() != kFp8BlockSize) {
      return Unsupported(Cat(display, ".group_size"),
                         Cat("= ", group ? Brief(*group) : "missing", ": only 128 is supported"));
    }
    c->activation = ActivationQuant::kDynamicTokenGroup;
    c->activation_group = kFp8BlockSize;
  } else if (!dynamic && s == "tensor") {
    c->activation = ActivationQuant::kStaticTensor;
  } else {
    return Unsupported(display,
                       Cat("strategy \"", s, "\" with dynamic = ", dynamic ? "true" : "false",
                           " (supported: dynamic token, dynamic group 128, static tensor)"));
  }
  return absl::OkStatus();
}

// std::regex reports a bad pattern by exception (the one place Tessera's
// model code meets one): caught here, at the boundary. nullopt when invalid.
std::optional<std::regex> CompileRegex(const std::string& pattern) {
  try {
    return std::regex(pattern);
  } catch (const std::regex_error&) {
    return std::nullopt;
  }
}

absl::StatusOr<QuantizationConfig> ParseCompressedTensors(const Json& q) {
  QuantizationConfig c;
  c.method = QuantMethod::kCompressedTensorsFp8;
  absl::StatusOr<std::optional<std::string>> format = OptString(q, "format", "format");
  if (!format.ok()) return format.status();
  if (!format->has_value() || **format != "float-quantized") {
    return Unsupported("format", Cat("= \"", format->value_or("(missing)"),
                                     "\": only \"float-quantized\" (FP8) is supported"));
  }
  if (Lookup(q, "kv_cache_scheme") != nullptr) {
    return Unsupported("kv_cache_scheme", "is set: FP8 KV-cache scales are not supported yet");
  }
  const Json* groups = Lookup(q, "config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return Invalid("config_groups", "must be a non-empty object");
  }
  if (groups->size() != 1) {
    return Unsupported("config_groups", Cat("has ", groups->size(),
                                            " groups: only one quantization scheme is supported"));
  }
  const std::string name = groups->begin().key();
  const Json& group = groups->begin().value();
  const std::string display = Cat("config_groups.", name);
  if (!group.is_object()) return Invalid(display, "must be an object");
  absl::StatusOr<std::vector<std::string>> targets =
      StringList(group, "targets", Cat(display, ".targets"));
  if (!targets.ok()) return targets.status();
  if (*targets != std::vector<std::string>{"Linear"}) {
    return Unsupported(Cat(display, ".targets"), "must be [\"Linear\"]");
  }
  if (Lookup(group, "output_activations") != nullptr) {
    return Unsupported(Cat(display, ".output_activations"), "is set: not supported");
  }
  const Json* weights = Lookup(group, "weights");
  if (weights == nullptr) return Invalid(Cat(display, ".weights"), "is missing");
  if (absl::Status s = ParseWeights(*weights, Cat(display, ".weights"), &c); !s.ok()) return s;
  if (absl::Status s = ParseInputActivations(Lookup(group, "input_activations"),
                                             Cat(display, ".input_activations"), &c);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<std::string>> ignore = StringList(q, "ignore", "ignore");
  if (!ignore.ok()) return ignore.status();
  for (const std::string& entry : *ignore) {
    if (!entry.starts_with("re:")) continue;
    if (!CompileRegex(entry.substr(3))) {
      return Invalid("ignore", Cat("has an invalid regular expression \"", entry, "\""));
    }
  }
  c.unquantized_modules = *std::move(ignore);
  return c;
}

// Whether `module` matches `entry` at dotted-component boundaries: equal, a
// suffix ("o_proj" of "model.layers.0.self_attn.o_proj") or a prefix
// ("model.layers.0" of "model.layers.0.mlp.up_proj").
bool MatchesComponents(std::string_view module, std::string_view entry) {
  if (entry.empty()) return false;
  if (module == entry) return true;
  if (module.size() > entry.size() && module.ends_with(entry) &&
      module[module.size() - entry.size() - 1] == '.') {
    return true;
  }
  return module.size() > entry.size() && module.starts_with(entry) && module[entry.size()] == '.';
}

// "re:<pattern>" full match; patterns were checked when the config was parsed.
bool MatchesRegex(std::string_view module, const std::string& pattern) {
  std::optional<std::regex> re = CompileRegex(pattern);
  return re && std::regex_match(module.begin(), module.end(), *re);
}

std::string_view FloatScaleName(DType t) { return DTypeName(t); }

absl::StatusOr<std::vector<float>> ScaleValues(std::string_view source, const TensorView& scale) {
  if (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16 && scale.dtype != DType::kF16) {
    return absl::InvalidArgumentError(Cat(source, ": scale \"", scale.name, "\" has dtype ",
                                          FloatScaleName(scale.dtype),
                                          "; FP8 scales must be F32, BF16 or F16"));
  }
  absl::StatusOr<std::vector<float>> values = ToFloat32(scale);
  if (!values.ok()) return values.status();
  return values;
}

// Finite and >= 0 (> 0 when `positive`), else an error naming the index.
absl::Status CheckScaleValues(std::string_view source, const TensorView& scale,
                              const std::vector<float>& values, bool positive) {
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (std::isfinite(v) && (positive ? v > 0 : v >= 0)) continue;
    const int64_t cols = scale.rank() == 2 ? scale.shape[1] : 1;
    const std::string where = scale.rank() == 2 ? Cat("[", static_cast<int64_t>(i) / cols, ", ",
                                                      static_cast<int64_t>(i) % cols, "]")
                                                : Cat("[", i, "]");
    return absl::InvalidArgumentError(
        Cat(source, ": scale \"", scale.name, "\" is ", std::isnan(v) ? "NaN" : Cat(v), " at ",
            where, "; FP8 scales must be finite and ", positive ? "> 0" : ">= 0"));
  }
  return absl::OkStatus();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// For a block scale of the wrong shape: the block size it would fit, if any.
std::string BlockDiagnosis(const QuantizationConfig& q, const TensorView& scale, int64_t out,
                           int64_t in) {
  if (q.weight_strategy != WeightScaleStrategy::kBlock || scale.rank() != 2) return "";
  for (int64_t b : {16, 32, 64, 256, 512}) {
    if (scale.shape[0] == CeilDiv(out, b) && scale.shape[1] == CeilDiv(in, b)) {
      return Cat(" (that is the shape for block size ", b, " x ", b, ", but quantization_config ",
                 "declares ", q.block_out, " x ", q.block_in, ")");
    }
  }
  return "";
}

}  // namespace

std::string_view QuantMethodName(QuantMethod m) {
  switch (m) {
    case QuantMethod::kFineGrainedFp8:
      return "fp8 (fine-grained)";
    case QuantMethod::kCompressedTensorsFp8:
      return "compressed-tensors (float-quantized)";
  }
  return "?";
}

std::string_view WeightScaleStrategyName(WeightScaleStrategy s) {
  switch (s) {
    case WeightScaleStrategy::kTensor:
      return "tensor";
    case WeightScaleStrategy::kChannel:
      return "channel";
    case WeightScaleStrategy::kBlock:
      return "block";
  }
  return "?";
}

std::string_view ActivationQuantName(ActivationQuant a) {
  switch (a) {
    case ActivationQuant::kNone:
      return "none (weight-only)";
    case ActivationQuant::kDynamicTokenGroup:
      return "dynamic per token group";
    case ActivationQuant::kDynamicToken:
      return "dynamic per token";
    case ActivationQuant::kStaticTensor:
      return "static per tensor (input_scale)";
  }
  return "?";
}

std::string_view QuantizationConfig::weight_scale_suffix() const {
  return method == QuantMethod::kFineGrainedFp8 ? "weight_scale_inv" : "weight_scale";
}

bool QuantizationConfig::IsQuantizedModule(std::string_view module) const {
  for (const std::string& entry : unquantized_modules) {
    if (entry.starts_with("re:")) {
      if (MatchesRegex(module, entry.substr(3))) return false;
    } else if (MatchesComponents(module, entry)) {
      return false;
    }
  }
  return true;
}

std::string QuantizationConfig::Describe() const {
  std::string weights = weight_strategy == WeightScaleStrategy::kBlock
                            ? Cat(block_out, "x", block_in, " block scales")
                            : Cat("per-", WeightScaleStrategyName(weight_strategy), " scales");
  std::string act(ActivationQuantName(activation));
  if (activation == ActivationQuant::kDynamicTokenGroup) act = Cat(act, " of ", activation_group);
  return Cat(QuantMethodName(method), ": e4m3 weights, ", weights, "; activations ", act,
             unquantized_modules.empty()
                 ? std::string()
                 : Cat("; ", unquantized_modules.size(), " module pattern(s) kept unquantized"));
}

absl::StatusOr<std::optional<QuantizationConfig>> ParseQuantizationConfig(const Json& config) {
  const Json* q = Lookup(config, "quantization_config");
  if (q == nullptr) return std::nullopt;
  if (!q->is_object()) {
    return absl::InvalidArgumentError(
        Cat("quantization_config must be an object, got ", Brief(*q)));
  }
  absl::StatusOr<std::optional<std::string>> method = OptString(*q, "quant_method", "quant_method");
  if (!method.ok()) return method.status();
  if (!method->has_value()) return Invalid("quant_method", "is missing");
  absl::StatusOr<QuantizationConfig> parsed =
      **method == "fp8" ? ParseFineGrained(*q)
      : **method == "compressed-tensors"
          ? ParseCompressedTensors(*q)
          : absl::StatusOr<QuantizationConfig>(Unsupported(
                "quant_method", Cat("= \"", **method, "\" (supported: fp8, compressed-tensors)")));
  if (!parsed.ok()) return parsed.status();
  return std::optional<QuantizationConfig>(*std::move(parsed));
}

std::vector<int64_t> WeightScaleShape(const QuantizationConfig& q, int64_t out, int64_t in) {
  switch (q.weight_strategy) {
    case WeightScaleStrategy::kTensor:
      return {1};
    case WeightScaleStrategy::kChannel:
      return {out, 1};
    case WeightScaleStrategy::kBlock:
      return {CeilDiv(out, q.block_out), CeilDiv(in, q.block_in)};
  }
  return {};
}

absl::Status CheckFp8Linear(const QuantizationConfig& q, std::string_view source,
                            const TensorView& weight, const TensorView& weight_scale,
                            const TensorView* input_scale) {
  if (weight.dtype != DType::kF8E4M3 || weight.rank() != 2) {
    return absl::InvalidArgumentError(
        Cat(source, ": tensor \"", weight.name, "\" has dtype ", DTypeName(weight.dtype),
            " and shape ", ShapeString(weight.shape), "; ", QuantMethodName(q.method),
            " needs an F8_E4M3 [out, in] weight (or the module listed as not quantized)"));
  }
  const int64_t out = weight.shape[0], in = weight.shape[1];
  std::vector<int64_t> want = WeightScaleShape(q, out, in);
  // Tensor scales are saved as [1] or as a scalar.
  const bool shape_ok =
      weight_scale.shape == want ||
      (q.weight_strategy == WeightScaleStrategy::kTensor && weight_scale.shape.empty());
  if (!shape_ok) {
    return absl::InvalidArgumentError(
        Cat(source, ": scale \"", weight_scale.name, "\" has shape ",
            ShapeString(weight_scale.shape), " but the ", ShapeString(weight.shape),
            " weight with ", WeightScaleStrategyName(q.weight_strategy), " scales needs ",
            ShapeString(want), BlockDiagnosis(q, weight_scale, out, in)));
  }
  absl::StatusOr<std::vector<float>> values = ScaleValues(source, weight_scale);
  if (!values.ok()) return values.status();
  if (absl::Status s = CheckScaleValues(source, weight_scale, *values, false); !s.ok()) return s;
  if (q.activation != ActivationQuant::kStaticTensor) return absl::OkStatus();
  if (input_scale == nullptr) {
    return absl::NotFoundError(Cat(source, ": missing the input_scale of \"", weight.name,
                                   "\" (static activation quantization)"));
  }
  if (!(input_scale->shape.empty() || input_scale->shape == std::vector<int64_t>{1})) {
    return absl::InvalidArgumentError(Cat(source, ": scale \"", input_scale->name, "\" has shape ",
                                          ShapeString(input_scale->shape),
                                          " but a static input scale is [1] or []"));
  }
  absl::StatusOr<std::vector<float>> input = ScaleValues(source, *input_scale);
  if (!input.ok()) return input.status();
  return CheckScaleValues(source, *input_scale, *input, true);
}

}  // namespace tessera::model
