// Runtime values of the Jinja interpreter, and how they print.
//
// The value model is the one @huggingface/jinja uses (the reference renderer
// of chat templates): undefined, none, booleans, integers and floats (both
// IEEE doubles, as in JavaScript), strings (UTF-8 here), lists, tuples,
// insertion-ordered mappings, keyword-argument bundles, namespaces and
// functions. Lists and tuples are immutable and shared; mappings are shared
// and only namespaces are ever mutated (by `{% set ns.x = ... %}`).
// Equality follows the reference too: `==` is JavaScript's loose equality on
// the underlying values (containers compare by identity), `in` its strict one.
//
// Thread-safety: a Value is not synchronised; values of one render stay on
// the rendering thread. Parsed templates never hold mutable values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tessera::text::jinja {

class Value;
class Scope;
using ValueList = std::vector<Value>;

class ValueMap;
struct Function;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNull,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kTuple,
    kObject,
    kKwargs,
    kNamespace,
    kFunction,
  };

  Value() = default;  // undefined
  static Value Null();
  static Value Bool(bool b);
  static Value Int(double d);
  static Value Float(double d);
  static Value String(std::string s);
  static Value Array(ValueList items);
  static Value Tuple(ValueList items);
  static Value Object(std::shared_ptr<ValueMap> map);
  static Value Kwargs(std::shared_ptr<ValueMap> map);
  static Value Namespace(std::shared_ptr<ValueMap> map);
  static Value MakeFunction(std::shared_ptr<const Function> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  // ArrayValue and its subclass TupleValue.
  bool is_list() const { return kind_ == Kind::kArray || kind_ == Kind::kTuple; }
  // ObjectValue and its subclass KeywordArgumentsValue.
  bool is_mapping() const { return kind_ == Kind::kObject || kind_ == Kind::kKwargs; }
  // Mappings and namespaces: what `.name` and `["name"]` look into.
  bool is_attribute_container() const { return is_mapping() || kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return bool_; }
  double number() const { return number_; }
  const std::string& str() const { return *string_; }
  const ValueList& list() const { return *list_; }
  ValueMap& map() const { return *map_; }
  const Function& function() const { return *function_; }

  // Python-style truthiness, as the reference's __bool__.
  bool Truthy() const;
  // The reference's type name ("StringValue", ...), for error messages.
  absl::string_view TypeName() const;
  // Address of the shared container, for identity comparisons.
  const void* Identity() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  double number_ = 0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueMap> map_;
  std::shared_ptr<const Function> function_;
};

// An insertion-ordered string-keyed map (JavaScript Map semantics).
class ValueMap {
 public:
  const Value* Find(absl::string_view key) const;
  // Inserts or replaces; a replaced key keeps its position.
  void Set(std::string key, Value value);
  bool Erase(absl::string_view key);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// A callable: a built-in function, a bound string/dict method or a macro.
// `args` holds the positional arguments, followed by one kKwargs value when
// the call had keyword arguments. `caller` is the scope of the call site
// (macros resolve free names there, as the reference does); builtins that
// need no scope are called with nullptr.
struct Function {
  std::string name;
  std::function<absl::StatusOr<Value>(ValueList& args, Scope* caller)> call;
};

// Converts request JSON to values. Integral floats become integers, as they
// do when JavaScript parses JSON. Objects keep the order their keys were given
// in (ordered_json), as Python dicts and JavaScript objects do, so `tojson`
// and dict iteration show a tool schema in the order the client wrote it.
// Nesting deeper than max_depth is an error.
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json, int max_depth);

// How `{{ value }}` prints (the reference's toString): none and undefined
// print nothing (callers skip them), booleans as true/false, floats with at
// least one decimal, containers as JSON.
absl::StatusOr<std::string> ToOutputString(const Value& v);

// How a value joins a string with `+` or `~`: strings as themselves, numbers
// in JavaScript's form (1.0 joins as "1"), booleans as true/false. Containers
// and functions are refused (the reference would print "[object Map]").
absl::StatusOr<std::string> ToConcatString(const Value& v);

struct JsonOptions {
  int indent = 0;  // 0: no newlines (the reference treats indent=0 as none)
  bool ensure_ascii = false;
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
};
// The reference's toJSON. undefined_as_null: undefined prints as null (tojson)
// rather than "undefined" (toString of a container).
absl::Status AppendJson(const Value& v, const JsonOptions& options, bool undefined_as_null,
                        std::string* out);

// `==` (JavaScript loose equality on the underlying values).
bool LooseEquals(const Value& a, const Value& b);
// `in` on a list (JavaScript strict equality on the underlying values).
bool StrictEquals(const Value& a, const Value& b);
// Set membership as JavaScript's Set (SameValueZero), for `unique`.
bool SameValueZero(const Value& a, const Value& b);

}  // namespace tessera::text::jinja
