#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "text/jinja/js_string.h"

namespace tessera::text::jinja {
namespace {

absl::Status Err(absl::string_view what) { return absl::InvalidArgumentError(what); }
absl::Status Unsupported(absl::string_view what) { return absl::UnimplementedError(what); }

absl::StatusOr<Value> CheckedString(std::string s, const BuiltinLimits& limits) {
  if (static_cast<int64_t>(s.size()) > limits.max_string_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a string grew past the limit of ", limits.max_string_bytes, " bytes"));
  }
  return Value::String(std::move(s));
}

// Code points of s, each as its own UTF-8 string (JavaScript's Array.from).
std::vector<std::string> CodePoints(absl::string_view s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    DecodeUtf8Next(s, &pos);
    out.emplace_back(s.substr(start, pos - start));
  }
  return out;
}

// UTF-16 code units of s, for JavaScript's string ordering.
std::u16string ToUtf16(absl::string_view s) {
  std::u16string out;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8Next(s, &pos);
    if (cp >= 0x10000) {
      out.push_back(static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(cp));
    }
  }
  return out;
}

// Array.prototype.join's view of a value: `x.value` joined as a string.
absl::StatusOr<std::string> JoinPiece(const Value& v) {
  if (v.is_null() || v.is_undefined()) return std::string();
  if (v.is_string() || v.is_number() || v.is_bool()) return ToConcatString(v);
  return Unsupported(absl::StrCat("join of a list holding a ", v.TypeName(), " is not supported"));
}

// `x.value` of a JavaScript value as a condition (indent's first/blank).
bool RawTruthy(const Value& v) {
  if (v.is_list() || v.is_attribute_container() || v.is_function()) return true;
  return v.Truthy();
}

// Python's str.title as the reference does it: /\b\w/g upper-cased (ASCII).
std::string TitleCase(absl::string_view s) {
  std::string out(s);
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  for (size_t i = 0; i < out.size(); ++i) {
    if (word(out[i]) && (i == 0 || !word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 32);
    }
  }
  return out;
}

absl::StatusOr<std::string> Capitalize(absl::string_view s) {
  if (s.empty()) return std::string();
  size_t pos = 0;
  const char32_t first = DecodeUtf8Next(s, &pos);
  if (first >= 0x10000) return std::string(s);  // charAt(0) is half a surrogate pair
  ASSIGN_OR_RETURN(std::string head, JsToUpper(s.substr(0, pos)));
  return absl::StrCat(head, s.substr(pos));
}

std::string Indent(absl::string_view s, int64_t width, bool first, bool blank) {
  const std::string pad(std::max<int64_t>(width, 0), ' ');
  std::vector<absl::string_view> lines = absl::StrSplit(s, '\n');
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out.push_back('\n');
    const bool skip = (!first && i == 0) || (!blank && lines[i].empty());
    if (!skip) out += pad;
    out.append(lines[i].data(), lines[i].size());
  }
  return out;
}

// The reference's replace(): count null/negative means all.
std::string Replace(absl::string_view s, absl::string_view from, absl::string_view to,
                    std::optional<double> count) {
  if (count && *count == 0) return std::string(s);
  double remaining = (!count || *count < 0) ? std::numeric_limits<double>::infinity() : *count;
  std::string out;
  if (from.empty()) {
    // Matches at every code point boundary, both ends included.
    size_t pos = 0;
    while (true) {
      if (remaining > 0) {
        out.append(to.data(), to.size());
        --remaining;
      }
      if (pos >= s.size()) break;
      const size_t start = pos;
      DecodeUtf8Next(s, &pos);
      absl::StrAppend(&out, s.substr(start, pos - start));
    }
    return out;
  }
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t hit = s.find(from, pos);
    if (hit == absl::string_view::npos || remaining <= 0) break;
    absl::StrAppend(&out, s.substr(pos, hit - pos));
    out.append(to.data(), to.size());
    --remaining;
    pos = hit + from.size();
  }
  absl::StrAppend(&out, s.substr(std::min(pos, s.size())));
  return out;
}

absl::StatusOr<Value> Split(const std::string& s, const ValueList& args,
                            const BuiltinLimits& limits) {
  const Value sep = args.size() > 0 ? args[0] : Value::Null();
  if (!(sep.is_string() || sep.is_null())) return Err("sep argument must be a string or null");
  const Value maxsplit_value = args.size() > 1 ? args[1] : Value::Int(-1);
  if (!maxsplit_value.is_int()) return Err("maxsplit argument must be a number");
  const double maxsplit = maxsplit_value.number();
  std::vector<std::string> parts;
  if (sep.is_null()) {
    const absl::string_view text = JsTrimStart(s);
    size_t pos = 0;
    while (pos < text.size()) {
      // Skip whitespace, then take the run of non-whitespace.
      size_t next = pos;
      if (IsJsWhitespace(DecodeUtf8Next(text, &next))) {
        pos = next;
        continue;
      }
      const size_t start = pos;
      while (pos < text.size()) {
        next = pos;
        if (IsJsWhitespace(DecodeUtf8Next(text, &next))) break;
        pos = next;
      }
      if (maxsplit != -1 && static_cast<double>(parts.size()) >= maxsplit) {
        parts.emplace_back(text.substr(start));
        break;
      }
      parts.emplace_back(text.substr(start, pos - start));
    }
  } else {
    if (sep.str().empty()) return Err("empty separator");
    for (absl::string_view p : absl::StrSplit(s, sep.str())) parts.emplace_back(p);
    if (maxsplit != -1 && static_cast<double>(parts.size()) > maxsplit) {
      // result.push(result.splice(maxsplit).join(sep))
      const double n = static_cast<double>(parts.size());
      double start = maxsplit < 0 ? std::max(n + maxsplit, 0.0) : std::min(maxsplit, n);
      const size_t at = static_cast<size_t>(start);
      std::string tail = absl::StrJoin(parts.begin() + at, parts.end(), sep.str());
      parts.resize(at);
      parts.push_back(std::move(tail));
    }
  }
  if (static_cast<int64_t>(parts.size()) > limits.max_list_items) {
    return absl::ResourceExhaustedError("split made too many parts");
  }
  ValueList out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::Array(std::move(out));
}

absl::StatusOr<Value> StartsOrEndsWith(const std::string& s, const ValueList& args, bool starts) {
  const char* name = starts ? "startswith" : "endswith";
  if (args.empty()) return Err(absl::StrCat(name, "() requires at least one argument"));
  auto test = [&](const std::string& p) {
    return starts ? absl::StartsWith(s, p) : absl::EndsWith(s, p);
  };
  const Value& pattern = args[0];
  if (pattern.is_string()) return Value::Bool(test(pattern.str()));
  if (pattern.is_list()) {
    for (const Value& item : pattern.list()) {
      if (!item.is_string()) return Err(absl::StrCat(name, "() tuple elements must be strings"));
      if (test(item.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return Err(absl::StrCat(name, "() argument must be a string or tuple of strings"));
}

absl::StatusOr<Value> StringReplace(const std::string& s, const ValueList& args,
                                    const BuiltinLimits& limits) {
  if (args.size() < 2) return Err("replace() requires at least two arguments");
  if (!(args[0].is_string() && args[1].is_string()))
    return Err("replace() arguments must be strings");
  Value count = Value::Null();
  if (args.size() > 2) {
    if (args[2].kind() == Value::Kind::kKwargs) {
      const Value* c = args[2].map().Find("count");
      count = c ? *c : Value::Null();
    } else {
      count = args[2];
    }
  }
  if (!(count.is_int() || count.is_null()))
    return Err("replace() count argument must be a number or null");
  std::optional<double> n;
  if (count.is_int()) n = count.number();
  // Bound the result before building it.
  const int64_t hits = args[0].str().empty()
                           ? CodePointCount(s) + 1
                           : static_cast<int64_t>(s.size() / args[0].str().size());
  if (static_cast<int64_t>(s.size()) + hits * static_cast<int64_t>(args[1].str().size()) >
      limits.max_string_bytes * 2) {
    return absl::ResourceExhaustedError("replace() would build a string past the size limit");
  }
  return CheckedString(Replace(s, args[0].str(), args[1].str(), n), limits);
}

std::shared_ptr<const Function> MakeMethod(std::string name,
                                           std::function<absl::StatusOr<Value>(ValueList&)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = [fn = std::move(fn)](ValueList& args, Scope*) { return fn(args); };
  return f;
}

Value StringMember(const Value& object, absl::string_view name, const BuiltinLimits& limits) {
  auto s = std::make_shared<const std::string>(object.str());
  std::function<absl::StatusOr<Value>(ValueList&)> fn;
  if (name == "length") return Value::Int(static_cast<double>(Utf16Length(*s)));
  if (name == "upper" || name == "lower") {
    const bool upper = name == "upper";
    fn = [s, upper](ValueList&) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string r, upper ? JsToUpper(*s) : JsToLower(*s));
      return Value::String(std::move(r));
    };
  } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
    // The reference ignores the characters argument and strips whitespace.
    const std::string which(name);
    fn = [s, which](ValueList&) -> absl::StatusOr<Value> {
      absl::string_view r = which == "strip"    ? JsTrim(*s)
                            : which == "lstrip" ? JsTrimStart(*s)
                                                : JsTrimEnd(*s);
      return Value::String(std::string(r));
    };
  } else if (name == "title") {
    fn = [s](ValueList&) -> absl::StatusOr<Value> { return Value::String(TitleCase(*s)); };
  } else if (name == "capitalize") {
    fn = [s](ValueList&) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string r, Capitalize(*s));
      return Value::String(std::move(r));
    };
  } else if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    fn = [s, starts](ValueList& args) { return StartsOrEndsWith(*s, args, starts); };
  } else if (name == "split") {
    fn = [s, limits](ValueList& args) { return Split(*s, args, limits); };
  } else if (name == "replace") {
    fn = [s, limits](ValueList& args) { return StringReplace(*s, args, limits); };
  } else {
    return Value();
  }
  return Value::MakeFunction(MakeMethod(std::string(name), std::move(fn)));
}

Value ItemsOf(const Value& object) {
  ValueList items;
  for (const auto& [k, v] : object.map().entries()) {
    items.push_back(Value::Array({Value::String(k), v}));
  }
  return Value::Array(std::move(items));
}

absl::StatusOr<Value> DictSort(const Value& object, const ValueList& raw_args) {
  ValueList args;
  const ValueMap* kwargs = nullptr;
  for (const Value& a : raw_args) {
    if (a.kind() == Value::Kind::kKwargs) {
      kwargs = &a.map();
    } else {
      args.push_back(a);
    }
  }
  auto pick = [&](size_t i, absl::string_view key, Value fallback) {
    if (i < args.size()) return args[i];
    if (kwargs != nullptr) {
      if (const Value* v = kwargs->Find(key)) return *v;
    }
    return fallback;
  };
  const Value case_sensitive = pick(0, "case_sensitive", Value::Bool(false));
  if (!case_sensitive.is_bool()) return Err("case_sensitive must be a boolean");
  const Value by = pick(1, "by", Value::String("key"));
  if (!by.is_string()) return Err("by must be a string");
  if (by.str() != "key" && by.str() != "value") return Err("by must be either 'key' or 'value'");
  const Value reverse = pick(2, "reverse", Value::Bool(false));
  if (!reverse.is_bool()) return Err("reverse must be a boolean");
  std::vector<std::pair<Value, Value>> pairs;
  for (const auto& [k, v] : object.map().entries()) pairs.emplace_back(Value::String(k), v);
  absl::Status failure;
  const bool by_key = by.str() == "key";
  std::stable_sort(pairs.begin(), pairs.end(), [&](const auto& x, const auto& y) {
    if (!failure.ok()) return false;
    auto c = CompareValues(by_key ? x.first : x.second, by_key ? y.first : y.second,
                           case_sensitive.bool_value());
    if (!c.ok()) {
      failure = c.status();
      return false;
    }
    return reverse.bool_value() ? *c > 0 : *c < 0;
  });
  RETURN_IF_ERROR(failure);
  ValueList items;
  for (auto& [k, v] : pairs) items.push_back(Value::Array({k, v}));
  return Value::Array(std::move(items));
}

Value MappingMember(const Value& object, absl::string_view name) {
  const Value obj = object;
  std::function<absl::StatusOr<Value>(ValueList&)> fn;
  if (name == "get") {
    fn = [obj](ValueList& args) -> absl::StatusOr<Value> {
      if (args.empty() || !args[0].is_string()) {
        return Err(absl::StrCat("Object key must be a string: got ",
                                args.empty() ? "UndefinedValue" : args[0].TypeName()));
      }
      if (const Value* v = obj.map().Find(args[0].str())) return *v;
      return args.size() > 1 ? args[1] : Value::Null();
    };
  } else if (name == "items") {
    fn = [obj](ValueList&) -> absl::StatusOr<Value> { return ItemsOf(obj); };
  } else if (name == "keys") {
    fn = [obj](ValueList&) -> absl::StatusOr<Value> {
      ValueList keys;
      for (const auto& [k, v] : obj.map().entries()) keys.push_back(Value::String(k));
      return Value::Array(std::move(keys));
    };
  } else if (name == "values") {
    fn = [obj](ValueList&) -> absl::StatusOr<Value> {
      ValueList values;
      for (const auto& [k, v] : obj.map().entries()) values.push_back(v);
      return Value::Array(std::move(values));
    };
  } else if (name == "dictsort") {
    fn = [obj](ValueList& args) { return DictSort(obj, args); };
  } else {
    return Value();
  }
  return Value::MakeFunction(MakeMethod(std::string(name), std::move(fn)));
}

// getAttributeValue: "a.b.0" through mappings/namespaces and lists.
Value AttributePath(const Value& item, absl::string_view path) {
  Value v = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (v.is_attribute_container()) {
      const Value* next = v.map().Find(part);
      v = next ? *next : Value();
    } else if (v.is_list()) {
      auto index = JsParseInt(part);
      if (!index || *index < 0 || *index >= static_cast<double>(v.list().size())) return Value();
      v = v.list()[static_cast<size_t>(*index)];
    } else {
      return Value();
    }
  }
  return v;
}

absl::StatusOr<Value> SortList(const Value& operand, bool reverse, bool case_sensitive,
                               const Value& attribute) {
  ValueList items = operand.list();
  absl::Status failure;
  auto key = [&](const Value& v) -> Value {
    if (attribute.is_null()) return v;
    const std::string path =
        attribute.is_int() ? JsNumberToString(attribute.number()) : attribute.str();
    return AttributePath(v, path);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    if (!failure.ok()) return false;
    auto c = CompareValues(key(x), key(y), case_sensitive);
    if (!c.ok()) {
      failure = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  RETURN_IF_ERROR(failure);
  return Value::Array(std::move(items));
}

absl::StatusOr<Value> JsonFilter(const Value& operand, const ValueMap& kwargs,
                                 const BuiltinLimits& limits) {
  JsonOptions options;
  if (const Value* indent = kwargs.Find("indent")) {
    if (!(indent->is_int() || indent->is_null())) return Err("If set, indent must be a number");
    if (indent->is_int()) {
      if (indent->number() > 64) return Unsupported("tojson indent above 64 is not supported");
      options.indent = static_cast<int>(indent->number());
    }
  }
  if (const Value* ascii = kwargs.Find("ensure_ascii")) {
    if (!ascii->is_bool()) return Err("If set, ensure_ascii must be a boolean");
    options.ensure_ascii = ascii->bool_value();
  }
  if (const Value* sort = kwargs.Find("sort_keys")) {
    if (!sort->is_bool()) return Err("If set, sort_keys must be a boolean");
    if (sort->bool_value()) {
      return Unsupported("tojson(sort_keys=true) is not supported (its locale-aware order)");
    }
  }
  if (const Value* seps = kwargs.Find("separators")) {
    if (seps->is_list()) {
      if (seps->list().size() != 2 || !seps->list()[0].is_string() ||
          !seps->list()[1].is_string()) {
        return Err("separators must be a tuple of two strings");
      }
      options.has_separators = true;
      options.item_separator = seps->list()[0].str();
      options.key_separator = seps->list()[1].str();
    } else if (!seps->is_null()) {
      return Err("If set, separators must be a tuple of two strings");
    }
  }
  std::string out;
  RETURN_IF_ERROR(AppendJson(operand, options, /*undefined_as_null=*/true, &out));
  return CheckedString(std::move(out), limits);
}

absl::StatusOr<Value> SelectAttr(bool select, const Value& operand, const ValueList& args,
                                 bool literal_args) {
  const char* name = select ? "selectattr" : "rejectattr";
  for (const Value& item : operand.list()) {
    if (!item.is_attribute_container()) {
      return Err(absl::StrCat("`", name, "` can only be applied to array of objects"));
    }
  }
  if (!literal_args) return Err(absl::StrCat("arguments of `", name, "` must be strings"));
  if (args.empty()) return Err(absl::StrCat("`", name, "` needs an attribute name"));
  const std::string& attr = args[0].str();
  const bool has_test = args.size() > 1;
  const Value* test_arg = args.size() > 2 ? &args[2] : nullptr;
  ValueList out;
  for (const Value& item : operand.list()) {
    const Value* a = item.map().Find(attr);
    bool result = false;
    if (a != nullptr) {
      if (has_test) {
        ASSIGN_OR_RETURN(result, ApplyTest(args[1].str(), *a, test_arg));
      } else {
        result = a->Truthy();
      }
    }
    if (result == select) out.push_back(item);
  }
  return Value::Array(std::move(out));
}

// Jinja's round(method='common'): half away from zero.
double RoundCommon(double d, int precision) {
  const double scale = std::pow(10.0, precision);
  return std::round(d * scale) / scale;
}

// select/reject: items passing a test (named by the first argument, with an
// optional second), or truthy items when no test is named.
absl::StatusOr<Value> SelectItems(bool select, const Value& operand, const ValueList& args) {
  if (!args.empty() && !args[0].is_string()) return Err("the test of select/reject must be a name");
  ValueList out;
  for (const Value& item : operand.list()) {
    bool result = item.Truthy();
    if (!args.empty()) {
      ASSIGN_OR_RETURN(result,
                       ApplyTest(args[0].str(), item, args.size() > 1 ? &args[1] : nullptr));
    }
    if (result == select) out.push_back(item);
  }
  return Value::Array(std::move(out));
}

absl::StatusOr<Value> NamedFilter(absl::string_view name, const Value& operand,
                                  const BuiltinLimits& limits) {
  const std::string n(name);
  if (operand.is_list()) {
    const ValueList& items = operand.list();
    if (n == "list") return operand;
    if (n == "first") return items.empty() ? Value() : items.front();
    if (n == "last") return items.empty() ? Value() : items.back();
    if (n == "length" || n == "count") return Value::Int(static_cast<double>(items.size()));
    if (n == "select" || n == "reject") return SelectItems(n == "select", operand, {});
    if (n == "reverse") return Value::Array(ValueList(items.rbegin(), items.rend()));
    if (n == "sort") return SortList(operand, false, false, Value::Null());
    if (n == "join") {
      std::string out;
      for (const Value& v : items) {
        ASSIGN_OR_RETURN(std::string piece, JoinPiece(v));
        out += piece;
        if (static_cast<int64_t>(out.size()) > limits.max_string_bytes) break;
      }
      return CheckedString(std::move(out), limits);
    }
    if (n == "string") {
      std::string out;
      RETURN_IF_ERROR(AppendJson(operand, JsonOptions(), false, &out));
      return CheckedString(std::move(out), limits);
    }
    if (n == "unique") {
      ValueList out;
      for (const Value& v : items) {
        bool seen = false;
        for (const Value& o : out) {
          if (SameValueZero(o, v)) {
            seen = true;
            break;
          }
        }
        if (!seen) out.push_back(v);
      }
      return Value::Array(std::move(out));
    }
    return Err(absl::StrCat("Unknown ArrayValue filter: ", n));
  }
  if (operand.is_string()) {
    const std::string& s = operand.str();
    if (n == "length" || n == "count") return Value::Int(static_cast<double>(Utf16Length(s)));
    if (n == "upper" || n == "lower" || n == "title" || n == "capitalize") {
      ValueList none;
      Value method = StringMember(operand, n, limits);
      return method.function().call(none, nullptr);
    }
    if (n == "trim") return Value::String(std::string(JsTrim(s)));
    if (n == "indent") return CheckedString(Indent(s, 4, false, false), limits);
    if (n == "join" || n == "string") return operand;
    if (n == "int") {
      auto v = JsParseInt(s);
      return Value::Int(v ? *v : 0);
    }
    if (n == "float") {
      auto v = JsParseFloat(s);
      return Value::Float(v ? *v : 0.0);
    }
    return Err(absl::StrCat("Unknown StringValue filter: ", n));
  }
  if (operand.is_number()) {
    const double d = operand.number();
    if (n == "round") return Value::Float(RoundCommon(d, 0));
    if (n == "abs") return operand.is_int() ? Value::Int(std::fabs(d)) : Value::Float(std::fabs(d));
    if (n == "int") return Value::Int(std::floor(d));
    if (n == "float") return Value::Float(d);
    if (n == "string") {
      ASSIGN_OR_RETURN(std::string s, ToOutputString(operand));
      return Value::String(std::move(s));
    }
    return Err(absl::StrCat("Unknown NumericValue filter: ", n));
  }
  if (operand.is_mapping()) {
    if (n == "items") return ItemsOf(operand);
    if (n == "length" || n == "count") return Value::Int(static_cast<double>(operand.map().size()));
    Value method = MappingMember(operand, n);
    if (method.is_function()) {
      ValueList none;
      return method.function().call(none, nullptr);
    }
    return Err(absl::StrCat("Unknown ObjectValue filter: ", n));
  }
  if (operand.is_bool()) {
    const bool b = operand.bool_value();
    if (n == "bool") return operand;
    if (n == "int") return Value::Int(b ? 1 : 0);
    if (n == "float") return Value::Float(b ? 1 : 0);
    if (n == "string") return Value::String(b ? "true" : "false");
    return Err(absl::StrCat("Unknown BooleanValue filter: ", n));
  }
  return Err(absl::StrCat("Cannot apply filter \"", n, "\" to type: ", operand.TypeName()));
}

absl::StatusOr<Value> CalledFilter(absl::string_view name, const Value& operand,
                                   const ValueList& args, const ValueMap& kwargs, bool literal_args,
                                   const BuiltinLimits& limits) {
  const std::string n(name);
  auto kw = [&](absl::string_view key) -> const Value* { return kwargs.Find(key); };
  if (n == "tojson") return JsonFilter(operand, kwargs, limits);
  if (n == "join") {
    std::vector<std::string> pieces;
    if (operand.is_string()) {
      pieces = CodePoints(operand.str());
    } else if (operand.is_list()) {
      for (const Value& v : operand.list()) {
        ASSIGN_OR_RETURN(std::string piece, JoinPiece(v));
        pieces.push_back(std::move(piece));
      }
    } else {
      return Err(absl::StrCat("Cannot apply filter \"join\" to type: ", operand.TypeName()));
    }
    Value sep = !args.empty() ? args[0] : (kw("separator") ? *kw("separator") : Value::String(""));
    if (!sep.is_string()) return Err("separator must be a string");
    int64_t total = 0;
    for (const std::string& p : pieces) total += p.size() + sep.str().size();
    if (total > limits.max_string_bytes) {
      return absl::ResourceExhaustedError("join would build a string past the size limit");
    }
    return Value::String(absl::StrJoin(pieces, sep.str()));
  }
  if (n == "int" || n == "float") {
    const bool is_int = n == "int";
    Value fallback = !args.empty()   ? args[0]
                     : kw("default") ? *kw("default")
                                     : (is_int ? Value::Int(0) : Value::Float(0));
    if (operand.is_string()) {
      auto v = is_int ? JsParseInt(operand.str()) : JsParseFloat(operand.str());
      if (!v) return fallback;
      return is_int ? Value::Int(*v) : Value::Float(*v);
    }
    if (operand.is_number()) return operand;
    if (operand.is_bool()) {
      return is_int ? Value::Int(operand.bool_value() ? 1 : 0)
                    : Value::Float(operand.bool_value() ? 1 : 0);
    }
    return Err(absl::StrCat("Cannot apply filter \"", n, "\" to type: ", operand.TypeName()));
  }
  if (n == "default") {
    Value fallback = !args.empty() ? args[0] : Value::String("");
    Value boolean =
        args.size() > 1 ? args[1] : (kw("boolean") ? *kw("boolean") : Value::Bool(false));
    if (!boolean.is_bool()) return Err("`default` filter flag must be a boolean");
    if (operand.is_undefined() || (boolean.bool_value() && !operand.Truthy())) return fallback;
    return operand;
  }
  if (operand.is_list()) {
    if (n == "sort") {
      auto pick = [&](size_t i, absl::string_view key, Value fallback) {
        if (i < args.size()) return args[i];
        if (const Value* v = kw(key)) return *v;
        return fallback;
      };
      const Value reverse = pick(0, "reverse", Value::Bool(false));
      if (!reverse.is_bool()) return Err("reverse must be a boolean");
      const Value cs = pick(1, "case_sensitive", Value::Bool(false));
      if (!cs.is_bool()) return Err("case_sensitive must be a boolean");
      const Value attribute = pick(2, "attribute", Value::Null());
      if (!(attribute.is_string() || attribute.is_int() || attribute.is_null())) {
        return Err("attribute must be a string, integer, or null");
      }
      return SortList(operand, reverse.bool_value(), cs.bool_value(), attribute);
    }
    if (n == "selectattr" || n == "rejectattr") {
      return SelectAttr(n == "selectattr", operand, args, literal_args);
    }
    if (n == "select" || n == "reject") return SelectItems(n == "select", operand, args);
    if (n == "map") {
      const Value* attr = kw("attribute");
      if (attr == nullptr) {
        return Unsupported(
            "`map` expressions without `attribute` set are not currently supported.");
      }
      if (!attr->is_string()) return Err("attribute must be a string");
      const Value* fallback = kw("default");
      ValueList out;
      for (const Value& item : operand.list()) {
        if (!item.is_attribute_container()) return Err("items in map must be an object");
        Value v = AttributePath(item, attr->str());
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      }
      return Value::Array(std::move(out));
    }
    return Err(absl::StrCat("Unknown ArrayValue filter: ", n));
  }
  if (n == "round" && operand.is_number()) {
    const Value precision =
        !args.empty() ? args[0] : (kw("precision") ? *kw("precision") : Value::Int(0));
    const Value method =
        args.size() > 1 ? args[1] : (kw("method") ? *kw("method") : Value::String("common"));
    if (!precision.is_int() || precision.number() < 0 || precision.number() > 15) {
      return Err("round precision must be an integer from 0 to 15");
    }
    if (!method.is_string()) return Err("round method must be a string");
    const double scale = std::pow(10.0, precision.number());
    const double x = operand.number() * scale;
    double r;
    if (method.str() == "common") {
      r = RoundCommon(operand.number(), static_cast<int>(precision.number()));
      return Value::Float(r);
    } else if (method.str() == "ceil") {
      r = std::ceil(x) / scale;
    } else if (method.str() == "floor") {
      r = std::floor(x) / scale;
    } else {
      return Err("round method must be 'common', 'ceil' or 'floor'");
    }
    return Value::Float(r);
  }
  if (operand.is_string()) {
    if (n == "indent") {
      auto pick = [&](size_t i, absl::string_view key, Value fallback) {
        if (i < args.size()) return args[i];
        if (const Value* v = kw(key)) return *v;
        return fallback;
      };
      const Value width = pick(0, "width", Value::Int(4));
      if (!width.is_int()) return Err("width must be a number");
      if (width.number() > 1024) return Unsupported("indent width above 1024 is not supported");
      const Value first = pick(1, "first", Value::Bool(false));
      const Value blank = pick(2, "blank", Value::Bool(false));
      return CheckedString(Indent(operand.str(), static_cast<int64_t>(width.number()),
                                  RawTruthy(first), RawTruthy(blank)),
                           limits);
    }
    if (n == "replace") {
      ValueList all = args;
      auto copy = std::make_shared<ValueMap>(kwargs);
      all.push_back(Value::Kwargs(std::move(copy)));
      return StringReplace(operand.str(), all, limits);
    }
    return Err(absl::StrCat("Unknown StringValue filter: ", n));
  }
  if (operand.is_mapping()) {
    Value method = MappingMember(operand, n);
    if (method.is_function()) {
      ValueList all = args;
      if (kwargs.size() > 0) all.push_back(Value::Kwargs(std::make_shared<ValueMap>(kwargs)));
      return method.function().call(all, nullptr);
    }
    return Err(absl::StrCat("Unknown ObjectValue filter: ", n));
  }
  return Err(absl::StrCat("Cannot apply filter \"", n, "\" to type: ", operand.TypeName()));
}

}  // namespace

absl::StatusOr<int> CompareValues(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) {
    return Err(absl::StrCat("Cannot compare ", a.TypeName(), " with ", b.TypeName()));
  }
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) {
    return Err(absl::StrCat("Cannot compare ", a.TypeName(), " with ", b.TypeName()));
  }
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) {
    const double x = a.is_bool() ? (a.bool_value() ? 1 : 0) : a.number();
    const double y = b.is_bool() ? (b.bool_value() ? 1 : 0) : b.number();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.kind() != b.kind()) {
    return Err(
        absl::StrCat("Cannot compare different types: ", a.TypeName(), " and ", b.TypeName()));
  }
  if (!a.is_string()) return Err(absl::StrCat("Cannot compare type: ", a.TypeName()));
  std::string x = a.str();
  std::string y = b.str();
  if (!case_sensitive) {
    ASSIGN_OR_RETURN(x, JsToLower(x));
    ASSIGN_OR_RETURN(y, JsToLower(y));
  }
  const std::u16string ux = ToUtf16(x);
  const std::u16string uy = ToUtf16(y);
  return ux < uy ? -1 : (ux > uy ? 1 : 0);
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand, bool called,
                                  const ValueList& args, const ValueMap& kwargs, bool literal_args,
                                  const BuiltinLimits& limits) {
  if (!called) {
    if (name == "safe") return operand;
    if (name == "tojson") {
      std::string out;
      RETURN_IF_ERROR(AppendJson(operand, JsonOptions(), true, &out));
      return CheckedString(std::move(out), limits);
    }
    return NamedFilter(name, operand, limits);
  }
  return CalledFilter(name, operand, args, kwargs, literal_args, limits);
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const Value* arg) {
  using K = Value::Kind;
  if (name == "boolean") return v.is_bool();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) return Err(absl::StrCat("cannot ", name, " on ", v.TypeName()));
    const bool odd = std::fmod(v.number(), 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "iterable") return v.kind() == K::kArray || v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "sequence") return v.is_list() || v.is_mapping() || v.is_string();
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    ASSIGN_OR_RETURN(std::string mapped, name == "lower" ? JsToLower(v.str()) : JsToUpper(v.str()));
    return mapped == v.str();
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "equalto" || name == "eq") {
    if (arg == nullptr) return Err(absl::StrCat("test '", name, "' needs a value to compare with"));
    return StrictEquals(v, *arg);
  }
  return Err(absl::StrCat("Unknown test: ", name));
}

Value BuiltinMember(const Value& object, absl::string_view name, const BuiltinLimits& limits) {
  if (object.is_string()) return StringMember(object, name, limits);
  if (object.is_mapping()) return MappingMember(object, name);
  if (object.is_list() && name == "length") {
    return Value::Int(static_cast<double>(object.list().size()));
  }
  return Value();
}

}  // namespace tessera::text::jinja
