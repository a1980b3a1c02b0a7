#include "text/jinja/value.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/jinja/js_string.h"

namespace tessera::text::jinja {

const Value* ValueMap::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void ValueMap::Set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

bool ValueMap::Erase(absl::string_view key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const size_t at = it->second;
  index_.erase(it);
  entries_.erase(entries_.begin() + at);
  for (auto& [k, i] : index_) {
    if (i > at) --i;
  }
  return true;
}

Value Value::Null() {
  Value v;
  v.kind_ = Kind::kNull;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(double d) {
  Value v;
  v.kind_ = Kind::kInt;
  v.number_ = d;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.number_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::Array(ValueList items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::Tuple(ValueList items) {
  Value v = Array(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
Value Value::Object(std::shared_ptr<ValueMap> map) {
  Value v;
  v.kind_ = Kind::kObject;
  v.map_ = std::move(map);
  return v;
}
Value Value::Kwargs(std::shared_ptr<ValueMap> map) {
  Value v = Object(std::move(map));
  v.kind_ = Kind::kKwargs;
  return v;
}
Value Value::Namespace(std::shared_ptr<ValueMap> map) {
  Value v = Object(std::move(map));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::MakeFunction(std::shared_ptr<const Function> fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::move(fn);
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
    case Kind::kFloat:
      return number_ != 0 && !std::isnan(number_);
    case Kind::kString:
      return !string_->empty();
    case Kind::kArray:
    case Kind::kTuple:
      return !list_->empty();
    case Kind::kObject:
    case Kind::kKwargs:
      return map_->size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

absl::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "UndefinedValue";
    case Kind::kNull:
      return "NullValue";
    case Kind::kBool:
      return "BooleanValue";
    case Kind::kInt:
      return "IntegerValue";
    case Kind::kFloat:
      return "FloatValue";
    case Kind::kString:
      return "StringValue";
    case Kind::kArray:
      return "ArrayValue";
    case Kind::kTuple:
      return "TupleValue";
    case Kind::kObject:
      return "ObjectValue";
    case Kind::kKwargs:
      return "KeywordArgumentsValue";
    case Kind::kNamespace:
      return "NamespaceValue";
    case Kind::kFunction:
      return "FunctionValue";
  }
  return "?";
}

const void* Value::Identity() const {
  if (list_) return list_.get();
  if (map_) return map_.get();
  if (function_) return function_.get();
  return nullptr;
}

namespace {

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int depth, int max_depth) {
  if (depth > max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("template input nests deeper than ", max_depth, " levels"));
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::Null();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(static_cast<double>(j.get<int64_t>()));
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<double>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isfinite(d) && std::floor(d) == d) return Value::Int(d);
      return Value::Float(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) {
        auto v = FromJson(e, depth + 1, max_depth);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::Array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto map = std::make_shared<ValueMap>();
      for (auto it = j.begin(); it != j.end(); ++it) {
        auto v = FromJson(it.value(), depth + 1, max_depth);
        if (!v.ok()) return v.status();
        map->Set(it.key(), *std::move(v));
      }
      return Value::Object(std::move(map));
    }
    default:
      return absl::InvalidArgumentError("template input holds a value that is not plain JSON");
  }
}

constexpr int kMaxJsonDepth = 512;

absl::Status AppendJsonAt(const Value& v, const JsonOptions& o, int depth, bool undefined_as_null,
                          std::string* out) {
  if (depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("value nests deeper than ", kMaxJsonDepth, " levels (or contains itself)"));
  }
  switch (v.kind()) {
    case Value::Kind::kNull:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kUndefined:
      out->append(undefined_as_null ? "null" : "undefined");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.bool_value() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      out->append(std::isfinite(v.number()) ? JsNumberToString(v.number()) : "null");
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendJsonString(v.str(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("Cannot convert to JSON: ", v.TypeName()));
  }
  if (o.indent < 0) return absl::InvalidArgumentError("tojson indent must not be negative");
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  if (o.has_separators) {
    item_sep = o.item_separator;
    key_sep = o.key_separator;
  } else if (o.indent > 0) {
    item_sep = ",";
  }
  const std::string indent_unit(o.indent, ' ');
  std::string base_pad = "\n";
  for (int i = 0; i < depth; ++i) base_pad += indent_unit;
  const std::string child_pad = base_pad + indent_unit;
  const bool pretty = o.indent > 0;
  if (v.kind() == Value::Kind::kArray) {
    const ValueList& items = v.list();
    out->push_back('[');
    if (pretty && !items.empty()) out->append(child_pad);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out->append(item_sep);
        if (pretty) out->append(child_pad);
      }
      absl::Status s = AppendJsonAt(items[i], o, depth + 1, undefined_as_null, out);
      if (!s.ok()) return s;
    }
    if (pretty && !items.empty()) out->append(base_pad);
    out->push_back(']');
    return absl::OkStatus();
  }
  const auto& entries = v.map().entries();
  out->push_back('{');
  bool first = true;
  for (const auto& [key, value] : entries) {
    if (!first) out->append(item_sep);
    first = false;
    if (pretty) out->append(child_pad);
    AppendJsonString(key, o.ensure_ascii, out);
    out->append(key_sep);
    absl::Status s = AppendJsonAt(value, o, depth + 1, undefined_as_null, out);
    if (!s.ok()) return s;
  }
  if (pretty && !entries.empty()) out->append(base_pad);
  out->push_back('}');
  return absl::OkStatus();
}

// A JavaScript primitive, for loose equality.
struct JsPrimitive {
  enum Type { kNullish, kBool, kNumber, kString, kObject } type;
  double number = 0;
  std::string string;
  const void* identity = nullptr;
  bool is_null = false;  // kNullish: null (true) or undefined (false)
};

JsPrimitive ToJs(const Value& v) {
  JsPrimitive p{JsPrimitive::kObject};
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      p.type = JsPrimitive::kNullish;
      break;
    case Value::Kind::kNull:
      p.type = JsPrimitive::kNullish;
      p.is_null = true;
      break;
    case Value::Kind::kBool:
      p.type = JsPrimitive::kBool;
      p.number = v.bool_value() ? 1 : 0;
      break;
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      p.type = JsPrimitive::kNumber;
      p.number = v.number();
      break;
    case Value::Kind::kString:
      p.type = JsPrimitive::kString;
      p.string = v.str();
      break;
    default:
      p.identity = v.Identity();
      break;
  }
  return p;
}

// ToPrimitive of the JavaScript object under a container value: an array
// joins its elements' toString with ","; a Map is "[object Map]". nullopt
// for things no string can equal.
std::optional<std::string> ObjectToPrimitive(const Value& v) {
  if (v.is_list()) {
    std::string out;
    bool first = true;
    for (const Value& e : v.list()) {
      if (!first) out.push_back(',');
      first = false;
      if (e.is_undefined()) {
        out += "undefined";
      } else if (e.is_null()) {
        out += "null";
      } else {
        auto s = ToOutputString(e);
        if (!s.ok()) return std::nullopt;
        out += *s;
      }
    }
    return out;
  }
  if (v.is_attribute_container()) return std::string("[object Map]");
  return std::nullopt;
}

bool LooseEqualsPrim(const JsPrimitive& a, const JsPrimitive& b, const Value* av, const Value* bv) {
  using T = JsPrimitive;
  if (a.type == b.type) {
    switch (a.type) {
      case T::kNullish:
        return true;
      case T::kBool:
      case T::kNumber:
        return a.number == b.number;
      case T::kString:
        return a.string == b.string;
      case T::kObject:
        return a.identity == b.identity;
    }
  }
  if (a.type == T::kNullish || b.type == T::kNullish) return false;
  if (a.type == T::kNumber && b.type == T::kString) return a.number == JsStringToNumber(b.string);
  if (a.type == T::kString && b.type == T::kNumber) return JsStringToNumber(a.string) == b.number;
  if (a.type == T::kBool) {
    T n{T::kNumber, a.number};
    return LooseEqualsPrim(n, b, nullptr, bv);
  }
  if (b.type == T::kBool) {
    T n{T::kNumber, b.number};
    return LooseEqualsPrim(a, n, av, nullptr);
  }
  if (a.type == T::kObject && av != nullptr) {
    auto s = ObjectToPrimitive(*av);
    if (!s) return false;
    T p{T::kString};
    p.string = *s;
    return LooseEqualsPrim(p, b, nullptr, bv);
  }
  if (b.type == T::kObject && bv != nullptr) {
    auto s = ObjectToPrimitive(*bv);
    if (!s) return false;
    T p{T::kString};
    p.string = *s;
    return LooseEqualsPrim(a, p, av, nullptr);
  }
  return false;
}

bool StrictPrim(const JsPrimitive& a, const JsPrimitive& b, bool nan_equal) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case JsPrimitive::kNullish:
      return a.is_null == b.is_null;
    case JsPrimitive::kBool:
      return a.number == b.number;
    case JsPrimitive::kNumber:
      return a.number == b.number || (nan_equal && std::isnan(a.number) && std::isnan(b.number));
    case JsPrimitive::kString:
      return a.string == b.string;
    case JsPrimitive::kObject:
      return a.identity == b.identity;
  }
  return false;
}

}  // namespace

absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json, int max_depth) {
  return FromJson(json, 0, max_depth);
}

absl::StatusOr<std::string> ToOutputString(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNull:
      return std::string();
    case Value::Kind::kBool:
      return std::string(v.bool_value() ? "true" : "false");
    case Value::Kind::kInt:
      return JsNumberToString(v.number());
    case Value::Kind::kFloat: {
      const double d = v.number();
      if (d == 0 && std::signbit(d)) return std::string("-0.0");
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 1e21) {
        return absl::StrFormat("%.1f", d);
      }
      return JsNumberToString(d);
    }
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("cannot print a function");
    default: {
      std::string out;
      absl::Status s = AppendJson(v, JsonOptions(), /*undefined_as_null=*/false, &out);
      if (!s.ok()) return s;
      return out;
    }
  }
}

absl::StatusOr<std::string> ToConcatString(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      return JsNumberToString(v.number());
    case Value::Kind::kBool:
      return std::string(v.bool_value() ? "true" : "false");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot join a ", v.TypeName(), " to a string (not supported)"));
  }
}

absl::Status AppendJson(const Value& v, const JsonOptions& options, bool undefined_as_null,
                        std::string* out) {
  return AppendJsonAt(v, options, 0, undefined_as_null, out);
}

bool LooseEquals(const Value& a, const Value& b) {
  return LooseEqualsPrim(ToJs(a), ToJs(b), &a, &b);
}

bool StrictEquals(const Value& a, const Value& b) { return StrictPrim(ToJs(a), ToJs(b), false); }

bool SameValueZero(const Value& a, const Value& b) { return StrictPrim(ToJs(a), ToJs(b), true); }

}  // namespace tessera::text::jinja
