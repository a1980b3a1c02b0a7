#include "text/jinja/interpreter.h"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "text/jinja/builtins.h"
#include "text/jinja/js_string.h"
#include "text/jinja/lexer.h"

namespace tessera::text::jinja {

Value Scope::Lookup(absl::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_) {
    auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return it->second;
  }
  return Value();
}

namespace {

constexpr absl::string_view kLoopControl = "\x01jinja-loop-control";
constexpr absl::string_view kErrorPrefix = "template error at ";

enum class Control { kNone, kBreak, kContinue };

bool IsLoopControl(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message() == kLoopControl;
}

// Names a macro body reads as `kwargs` / `varargs` (the reference collects
// them so a macro only accepts extra arguments when it uses them).
void CollectSpecialNames(const Node& n, bool* kwargs, bool* varargs) {
  if (n.kind == NodeKind::kIdentifier) {
    if (n.text == "kwargs") *kwargs = true;
    if (n.text == "varargs") *varargs = true;
  }
  if (n.kind == NodeKind::kMember && !n.flag) {
    if (n.a) CollectSpecialNames(*n.a, kwargs, varargs);
    return;  // a.kwargs is an attribute, not a load
  }
  if (n.kind == NodeKind::kFilter) {
    if (n.a) CollectSpecialNames(*n.a, kwargs, varargs);
    if (n.b && n.b->kind == NodeKind::kCall) {
      for (const NodePtr& arg : n.b->list) CollectSpecialNames(*arg, kwargs, varargs);
    }
    return;
  }
  for (const NodePtr* p : {&n.a, &n.b, &n.c}) {
    if (*p) CollectSpecialNames(**p, kwargs, varargs);
  }
  for (const auto* v : {&n.list, &n.body, &n.alternate}) {
    for (const NodePtr& p : *v) CollectSpecialNames(*p, kwargs, varargs);
  }
}

const char* const kMonths[] = {"January",   "February", "March",    "April",
                               "May",       "June",     "July",     "August",
                               "September", "October",  "November", "December"};

std::string StrftimeJs(absl::string_view format, absl::Time now) {
  const absl::TimeZone tz = absl::LocalTimeZone();
  const absl::CivilSecond c = absl::ToCivilSecond(now, tz);
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char f = format[i + 1];
    switch (f) {
      case 'Y':
        absl::StrAppend(&out, c.year());
        break;
      case 'm':
        absl::StrAppendFormat(&out, "%02d", c.month());
        break;
      case 'd':
        absl::StrAppendFormat(&out, "%02d", c.day());
        break;
      case 'b':
        out += std::string(kMonths[c.month() - 1]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[c.month() - 1];
        break;
      case 'H':
        absl::StrAppendFormat(&out, "%02d", c.hour());
        break;
      case 'M':
        absl::StrAppendFormat(&out, "%02d", c.minute());
        break;
      case '%':
        out.push_back('%');
        break;
      default:
        out.push_back('%');
        continue;  // the next character is copied as it is
    }
    ++i;
  }
  return out;
}

class Interpreter {
 public:
  Interpreter(absl::string_view source, const RenderLimits& limits, absl::Time now)
      : source_(source), limits_(limits), now_(now) {
    builtin_limits_.max_string_bytes = limits.max_output_bytes;
    builtin_limits_.max_list_items = limits.max_list_items;
  }

  absl::StatusOr<std::string> Run(const Node& program, const ValueMap& variables) {
    Scope globals(nullptr);
    SetupGlobals(&globals);
    for (const auto& [name, value] : variables.entries()) {
      if (globals.HasLocal(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "template variable '", name, "' is already declared (it names a builtin)"));
      }
      globals.Set(name, value);
    }
    auto out = EvalBlock(program.body, globals);
    if (!out.ok() && IsLoopControl(out.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(kErrorPrefix, DescribePosition(source_, control_offset_), ": ",
                       control_ == Control::kBreak ? "break" : "continue", " outside a loop"));
    }
    return out;
  }

 private:
  // Counts evaluation depth (for the stack) while alive.
  class DepthGuard {
   public:
    explicit DepthGuard(Interpreter* in) : in_(in) { ++in_->depth_; }
    ~DepthGuard() { --in_->depth_; }

   private:
    Interpreter* in_;
  };

  absl::Status Error(const Node& n, absl::string_view what,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) const {
    return absl::Status(
        code, absl::StrCat(kErrorPrefix, DescribePosition(source_, n.offset), ": ", what));
  }
  // Adds the position of `n` to an error that has none yet.
  absl::Status Annotate(const Node& n, const absl::Status& s) const {
    if (s.ok() || IsLoopControl(s) || absl::StartsWith(s.message(), kErrorPrefix)) return s;
    return Error(n, s.message(), s.code());
  }
  absl::Status Exhausted(const Node& n, absl::string_view what) const {
    return Error(n, what, absl::StatusCode::kResourceExhausted);
  }
  absl::Status Step(const Node& n) {
    if (++steps_ > limits_.max_steps) {
      return Exhausted(n, absl::StrCat("the template ran more than ", limits_.max_steps,
                                       " steps (is it looping without end?)"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Value> CheckedString(const Node& n, std::string s) const {
    if (static_cast<int64_t>(s.size()) > limits_.max_output_bytes) {
      return Exhausted(
          n, absl::StrCat("a string grew past the limit of ", limits_.max_output_bytes, " bytes"));
    }
    return Value::String(std::move(s));
  }

  std::shared_ptr<const Function> MakeBuiltin(
      std::string name, std::function<absl::StatusOr<Value>(ValueList&, Scope*)> fn) {
    auto f = std::make_shared<Function>();
    f->name = std::move(name);
    f->call = std::move(fn);
    return f;
  }

  void SetupGlobals(Scope* g) {
    g->Set("namespace", Value::MakeFunction(MakeBuiltin("namespace", [](ValueList& args, Scope*) {
             return MakeNamespace(args);
           })));
    g->Set("false", Value::Bool(false));
    g->Set("true", Value::Bool(true));
    g->Set("none", Value::Null());
    g->Set("raise_exception",
           Value::MakeFunction(
               MakeBuiltin("raise_exception", [](ValueList& args, Scope*) -> absl::StatusOr<Value> {
                 std::string msg;
                 for (size_t i = 0; i < args.size(); ++i) {
                   auto s = ToOutputString(args[i]);
                   absl::StrAppend(&msg, i > 0 ? "," : "", s.ok() ? *s : std::string("?"));
                 }
                 return absl::InvalidArgumentError(absl::StrCat("raise_exception: ", msg));
               })));
    g->Set("range", Value::MakeFunction(MakeBuiltin(
                        "range", [this](ValueList& args, Scope*) { return Range(args); })));
    g->Set("strftime_now",
           Value::MakeFunction(MakeBuiltin(
               "strftime_now", [this](ValueList& args, Scope*) -> absl::StatusOr<Value> {
                 if (args.empty() || !args[0].is_string()) {
                   return absl::InvalidArgumentError("strftime_now() needs a format string");
                 }
                 return Value::String(StrftimeJs(args[0].str(), now_));
               })));
    g->Set("True", Value::Bool(true));
    g->Set("False", Value::Bool(false));
    g->Set("None", Value::Null());
  }

  static absl::StatusOr<Value> MakeNamespace(ValueList& args) {
    ValueList positional = args;
    const ValueMap* kwargs = nullptr;
    if (!positional.empty() && positional.back().kind() == Value::Kind::kKwargs) {
      kwargs = &positional.back().map();
    }
    const size_t n = positional.size() - (kwargs ? 1 : 0);
    if (n > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace expected at most 1 argument, got ", n));
    }
    auto entries = std::make_shared<ValueMap>();
    if (n == 1) {
      const Value& source = positional[0];
      if (source.is_mapping()) {
        for (const auto& [k, v] : source.map().entries()) entries->Set(k, v);
      } else if (source.is_list()) {
        for (const Value& pair : source.list()) {
          ValueList kv;
          if (pair.is_list()) {
            kv = pair.list();
          } else if (pair.is_string()) {
            size_t pos = 0;
            while (pos < pair.str().size()) {
              const size_t start = pos;
              DecodeUtf8Next(pair.str(), &pos);
              kv.push_back(Value::String(pair.str().substr(start, pos - start)));
            }
          }
          if (kv.size() != 2) {
            return absl::InvalidArgumentError(
                "namespace expected an object or an iterable of [key, value] pairs");
          }
          if (!kv[0].is_string())
            return absl::InvalidArgumentError("namespace keys must be strings");
          entries->Set(kv[0].str(), kv[1]);
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("'", source.TypeName(), "' object is not iterable"));
      }
    }
    if (kwargs) {
      for (const auto& [k, v] : kwargs->entries()) entries->Set(k, v);
    }
    return Value::Namespace(std::move(entries));
  }

  absl::StatusOr<Value> Range(ValueList& args) {
    std::vector<double> nums;
    for (const Value& a : args) {
      if (a.is_number()) {
        nums.push_back(a.number());
      } else if (a.is_bool()) {
        nums.push_back(a.bool_value() ? 1 : 0);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("range() needs numbers, got ", a.TypeName()));
      }
    }
    if (nums.empty() || nums.size() > 3) {
      return absl::InvalidArgumentError("range() takes one to three numbers");
    }
    double start = 0, stop = 0, step = 1;
    if (nums.size() == 1) {
      stop = nums[0];
    } else {
      start = nums[0];
      stop = nums[1];
      if (nums.size() == 3) step = nums[2];
    }
    if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
    const double count = std::ceil((stop - start) / step);
    if (!(count <= static_cast<double>(limits_.max_list_items))) {
      return absl::ResourceExhaustedError(
          absl::StrCat("range() of more than ", limits_.max_list_items, " items"));
    }
    ValueList out;
    if (step > 0) {
      for (double i = start; i < stop; i += step) out.push_back(NumberValue(i));
    } else {
      for (double i = start; i > stop; i += step) out.push_back(NumberValue(i));
    }
    return Value::Array(std::move(out));
  }

  static Value NumberValue(double d) {
    return std::isfinite(d) && std::floor(d) == d ? Value::Int(d) : Value::Float(d);
  }

  absl::StatusOr<std::string> EvalBlock(const std::vector<NodePtr>& statements, Scope& scope) {
    std::string out;
    for (const NodePtr& s : statements) {
      ASSIGN_OR_RETURN(Value v, Eval(*s, scope));
      if (v.is_null() || v.is_undefined()) continue;
      if (v.is_string()) {
        out += v.str();
      } else {
        auto text = ToOutputString(v);
        if (!text.ok()) return Annotate(*s, text.status());
        out += *text;
      }
      if (static_cast<int64_t>(out.size()) > limits_.max_output_bytes) {
        return Exhausted(*s, absl::StrCat("the output grew past the limit of ",
                                          limits_.max_output_bytes, " bytes"));
      }
    }
    return out;
  }

  absl::StatusOr<Value> Eval(const Node& n, Scope& scope) {
    DepthGuard guard(this);
    if (depth_ > limits_.max_eval_depth) {
      return Exhausted(
          n, absl::StrCat("evaluation nests deeper than ", limits_.max_eval_depth, " levels"));
    }
    RETURN_IF_ERROR(Step(n));
    switch (n.kind) {
      case NodeKind::kProgram: {
        ASSIGN_OR_RETURN(std::string s, EvalBlock(n.body, scope));
        return Value::String(std::move(s));
      }
      case NodeKind::kText:
        return Value::String(n.text);
      case NodeKind::kComment:
        return Value::Null();
      case NodeKind::kIf: {
        ASSIGN_OR_RETURN(Value test, Eval(*n.a, scope));
        ASSIGN_OR_RETURN(std::string s, EvalBlock(test.Truthy() ? n.body : n.alternate, scope));
        return Value::String(std::move(s));
      }
      case NodeKind::kFor:
        return EvalFor(n, scope);
      case NodeKind::kSet:
        return EvalSet(n, scope);
      case NodeKind::kMacro:
        return EvalMacro(n, scope);
      case NodeKind::kCallBlock:
        return EvalCallBlock(n, scope);
      case NodeKind::kFilterBlock: {
        ASSIGN_OR_RETURN(std::string body, EvalBlock(n.body, scope));
        return ApplyFilterNode(*n.a, Value::String(std::move(body)), scope);
      }
      case NodeKind::kBreak:
      case NodeKind::kContinue:
        control_ = n.kind == NodeKind::kBreak ? Control::kBreak : Control::kContinue;
        control_offset_ = n.offset;
        return absl::AbortedError(kLoopControl);
      case NodeKind::kInteger:
        return Value::Int(n.number);
      case NodeKind::kFloat:
        return Value::Float(n.number);
      case NodeKind::kString:
        return Value::String(n.text);
      case NodeKind::kArray:
      case NodeKind::kTuple: {
        ValueList items;
        for (const NodePtr& e : n.list) {
          ASSIGN_OR_RETURN(Value v, Eval(*e, scope));
          items.push_back(std::move(v));
        }
        return n.kind == NodeKind::kArray ? Value::Array(std::move(items))
                                          : Value::Tuple(std::move(items));
      }
      case NodeKind::kObject: {
        auto map = std::make_shared<ValueMap>();
        for (size_t i = 0; i + 1 < n.list.size(); i += 2) {
          ASSIGN_OR_RETURN(Value key, Eval(*n.list[i], scope));
          if (!key.is_string()) {
            return Error(*n.list[i],
                         absl::StrCat("Object keys must be strings: got ", key.TypeName()));
          }
          ASSIGN_OR_RETURN(Value value, Eval(*n.list[i + 1], scope));
          map->Set(key.str(), std::move(value));
        }
        return Value::Object(std::move(map));
      }
      case NodeKind::kIdentifier:
        return scope.Lookup(n.text);
      case NodeKind::kMember:
        return EvalMember(n, scope);
      case NodeKind::kCall:
        return EvalCall(n, scope);
      case NodeKind::kUnary:
        return EvalUnary(n, scope);
      case NodeKind::kBinary:
        return EvalBinary(n, scope);
      case NodeKind::kFilter: {
        ASSIGN_OR_RETURN(Value operand, Eval(*n.a, scope));
        return ApplyFilterNode(*n.b, operand, scope);
      }
      case NodeKind::kTest: {
        ASSIGN_OR_RETURN(Value operand, Eval(*n.a, scope));
        auto result = ApplyTest(n.text, operand, nullptr);
        if (!result.ok()) return Annotate(n, result.status());
        return Value::Bool(n.flag ? !*result : *result);
      }
      case NodeKind::kSelect: {
        ASSIGN_OR_RETURN(Value test, Eval(*n.b, scope));
        if (!test.Truthy()) return Value();
        return Eval(*n.a, scope);
      }
      case NodeKind::kTernary: {
        ASSIGN_OR_RETURN(Value test, Eval(*n.a, scope));
        return Eval(test.Truthy() ? *n.b : *n.c, scope);
      }
      case NodeKind::kSlice:
      case NodeKind::kKeywordArg:
      case NodeKind::kSpread:
      case NodeKind::kKeywordSpread:
        return Error(n, "this expression is only allowed inside [] or a call");
    }
    return Error(n, "unknown node");
  }

  // Positional values (with `*` expanded), then keyword values.
  absl::Status EvalArguments(const std::vector<NodePtr>& args, Scope& scope, ValueList* positional,
                             ValueMap* keywords) {
    for (const NodePtr& a : args) {
      if (a->kind == NodeKind::kSpread) {
        ASSIGN_OR_RETURN(Value v, Eval(*a->a, scope));
        if (!v.is_list())
          return Error(*a, absl::StrCat("Cannot unpack non-iterable type: ", v.TypeName()));
        for (const Value& e : v.list()) positional->push_back(e);
      } else if (a->kind != NodeKind::kKeywordArg && a->kind != NodeKind::kKeywordSpread) {
        ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
        positional->push_back(std::move(v));
      }
    }
    for (const NodePtr& a : args) {
      if (a->kind == NodeKind::kKeywordArg) {
        if (keywords->Find(a->text) != nullptr) {
          return Error(*a,
                       absl::StrCat("Got multiple values for keyword argument '", a->text, "'"));
        }
        ASSIGN_OR_RETURN(Value v, Eval(*a->a, scope));
        keywords->Set(a->text, std::move(v));
      } else if (a->kind == NodeKind::kKeywordSpread) {
        ASSIGN_OR_RETURN(Value v, Eval(*a->a, scope));
        if (!v.is_mapping()) {
          return Error(*a, absl::StrCat("Argument after ** must be a mapping, not ", v.TypeName()));
        }
        for (const auto& [k, e] : v.map().entries()) {
          if (keywords->Find(k) != nullptr) {
            return Error(*a, absl::StrCat("Got multiple values for keyword argument '", k, "'"));
          }
          keywords->Set(k, e);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> ApplyFilterNode(const Node& filter, const Value& operand, Scope& scope) {
    if (filter.kind == NodeKind::kIdentifier) {
      ValueList none;
      ValueMap no_kwargs;
      auto r = ApplyFilter(filter.text, operand, false, none, no_kwargs, false, builtin_limits_);
      if (!r.ok()) return Annotate(filter, r.status());
      return r;
    }
    // kCall with an identifier callee (checked by the parser).
    ValueList args;
    ValueMap kwargs;
    RETURN_IF_ERROR(EvalArguments(filter.list, scope, &args, &kwargs));
    bool literal = true;
    for (const NodePtr& a : filter.list) literal = literal && a->kind == NodeKind::kString;
    auto r = ApplyFilter(filter.a->text, operand, true, args, kwargs, literal, builtin_limits_);
    if (!r.ok()) return Annotate(filter, r.status());
    return r;
  }

  absl::StatusOr<Value> CallFunction(const Node& n, const Value& fn, ValueList& args,
                                     Scope& scope) {
    if (!fn.is_function()) {
      return Error(
          n, absl::StrCat("Cannot call something that is not a function: got ", fn.TypeName()));
    }
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      return Exhausted(
          n, absl::StrCat("macro calls nest deeper than ", limits_.max_call_depth, " levels"));
    }
    auto r = fn.function().call(args, &scope);
    --call_depth_;
    if (!r.ok()) return Annotate(n, r.status());
    return r;
  }

  absl::StatusOr<Value> EvalCall(const Node& n, Scope& scope) {
    ValueList args;
    ValueMap kwargs;
    RETURN_IF_ERROR(EvalArguments(n.list, scope, &args, &kwargs));
    if (kwargs.size() > 0)
      args.push_back(Value::Kwargs(std::make_shared<ValueMap>(std::move(kwargs))));
    ASSIGN_OR_RETURN(Value fn, Eval(*n.a, scope));
    return CallFunction(n, fn, args, scope);
  }

  // String index in UTF-16 code units, as JavaScript's String.prototype.at.
  absl::StatusOr<Value> StringAt(const Node& n, const std::string& s, double index) {
    const int64_t len = Utf16Length(s);
    double i = index < 0 ? len + index : index;
    if (i < 0 || i >= len || std::floor(i) != i) return Value();
    int64_t unit = 0;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t start = pos;
      const char32_t cp = DecodeUtf8Next(s, &pos);
      const int width = cp >= 0x10000 ? 2 : 1;
      if (static_cast<int64_t>(i) < unit + width) {
        if (width == 2) {
          return Error(n,
                       "indexing into a character outside the Basic Multilingual Plane "
                       "is not supported",
                       absl::StatusCode::kUnimplemented);
        }
        return Value::String(s.substr(start, pos - start));
      }
      unit += width;
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Node& n, const Value& object, Scope& scope) {
    if (!(object.is_list() || object.is_string()))
      return Error(n, "Slice object must be an array or string");
    std::optional<double> parts[3];
    const NodePtr* nodes[3] = {&n.a, &n.b, &n.c};
    const char* names[3] = {"start", "stop", "step"};
    for (int i = 0; i < 3; ++i) {
      if (!*nodes[i]) continue;
      ASSIGN_OR_RETURN(Value v, Eval(**nodes[i], scope));
      if (v.is_undefined()) continue;
      if (!v.is_int())
        return Error(n, absl::StrCat("Slice ", names[i], " must be numeric or undefined"));
      parts[i] = v.number();
    }
    std::vector<std::string> chars;
    const bool is_string = object.is_string();
    if (is_string) {
      size_t pos = 0;
      const std::string& s = object.str();
      while (pos < s.size()) {
        const size_t start = pos;
        DecodeUtf8Next(s, &pos);
        chars.push_back(s.substr(start, pos - start));
      }
    }
    const double len = is_string ? chars.size() : object.list().size();
    const double step = parts[2].value_or(1);
    const int direction = step > 0 ? 1 : (step < 0 ? -1 : 0);
    double start, stop;
    if (direction >= 0) {
      start = parts[0].value_or(0);
      start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
      stop = parts[1].value_or(len);
      stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
    } else {
      start = parts[0].value_or(len - 1);
      start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
      stop = parts[1].value_or(-1);
      stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
    }
    ValueList items;
    std::string text;
    for (double i = start; direction * i < direction * stop; i += step) {
      const size_t at = static_cast<size_t>(i);
      if (is_string) {
        text += chars[at];
      } else {
        items.push_back(object.list()[at]);
      }
    }
    if (is_string) return Value::String(std::move(text));
    return Value::Array(std::move(items));
  }

  absl::StatusOr<Value> EvalMember(const Node& n, Scope& scope) {
    ASSIGN_OR_RETURN(Value object, Eval(*n.a, scope));
    Value property;
    if (n.flag) {
      if (n.b->kind == NodeKind::kSlice) return EvalSlice(*n.b, object, scope);
      ASSIGN_OR_RETURN(property, Eval(*n.b, scope));
    } else if (n.b->kind == NodeKind::kInteger) {
      property = Value::Int(n.b->number);
    } else {
      property = Value::String(n.b->text);
    }
    if (object.is_attribute_container()) {
      if (!property.is_string()) {
        return Error(
            n, absl::StrCat("Cannot access property with non-string: got ", property.TypeName()));
      }
      if (const Value* v = object.map().Find(property.str())) return *v;
      if (object.is_mapping()) return BuiltinMember(object, property.str(), builtin_limits_);
      return Value();
    }
    if (object.is_list() || object.is_string()) {
      if (property.is_int()) {
        if (object.is_string()) return StringAt(n, object.str(), property.number());
        const ValueList& items = object.list();
        const double len = items.size();
        const double i = property.number() < 0 ? len + property.number() : property.number();
        if (i < 0 || i >= len || std::floor(i) != i) return Value();
        return items[static_cast<size_t>(i)];
      }
      if (property.is_string()) return BuiltinMember(object, property.str(), builtin_limits_);
      return Error(n, absl::StrCat("Cannot access property with non-string/non-number: got ",
                                   property.TypeName()));
    }
    if (!property.is_string()) {
      return Error(
          n, absl::StrCat("Cannot access property with non-string: got ", property.TypeName()));
    }
    return Value();  // other values have no members
  }

  absl::StatusOr<Value> EvalUnary(const Node& n, Scope& scope) {
    ASSIGN_OR_RETURN(Value v, Eval(*n.a, scope));
    if (n.text == "not") return Value::Bool(!v.Truthy());
    const double sign = n.text == "-" ? -1 : 1;
    if (v.is_number() || v.is_bool()) {
      const double x = v.is_bool() ? (v.bool_value() ? 1 : 0) : v.number();
      return v.kind() == Value::Kind::kFloat ? Value::Float(sign * x) : Value::Int(sign * x);
    }
    return Error(n, absl::StrCat("Unknown operator \"", n.text, "\" for ", v.TypeName()));
  }

  absl::StatusOr<Value> EvalBinary(const Node& n, Scope& scope) {
    ASSIGN_OR_RETURN(Value left, Eval(*n.a, scope));
    const std::string& op = n.text;
    if (op == "and") return left.Truthy() ? Eval(*n.b, scope) : left;
    if (op == "or") return left.Truthy() ? left : Eval(*n.b, scope);
    ASSIGN_OR_RETURN(Value right, Eval(*n.b, scope));
    if (op == "==") return Value::Bool(LooseEquals(left, right));
    if (op == "!=") return Value::Bool(!LooseEquals(left, right));
    const bool membership = op == "in" || op == "not in";
    if (left.is_undefined() || right.is_undefined()) {
      if (right.is_undefined() && membership) return Value::Bool(op == "not in");
      return Error(n, absl::StrCat("Cannot perform operation ", op, " on undefined values"));
    }
    if (left.is_null() || right.is_null())
      return Error(n, "Cannot perform operation on null values");
    if (op == "~") {
      ASSIGN_OR_RETURN(std::string a, Concat(n, left));
      ASSIGN_OR_RETURN(std::string b, Concat(n, right));
      return CheckedString(n, a + b);
    }
    const auto numeric_like = [](const Value& v) { return v.is_number() || v.is_bool(); };
    if (op == "**" && numeric_like(left) && numeric_like(right)) {
      const double a = left.is_bool() ? left.bool_value() : left.number();
      const double b = right.is_bool() ? right.bool_value() : right.number();
      if (a == 0 && b < 0) return Error(n, "0.0 cannot be raised to a negative power");
      const double r = std::pow(a, b);
      if (!std::isfinite(r)) return Error(n, "Exponentiation result is not a finite real number");
      const bool is_float =
          left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat || b < 0;
      return is_float ? Value::Float(r) : Value::Int(r);
    }
    if (left.is_number() && right.is_number()) {
      const double a = left.number();
      const double b = right.number();
      const bool is_float =
          left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat;
      auto number = [is_float](double r) { return is_float ? Value::Float(r) : Value::Int(r); };
      if (op == "+") return number(a + b);
      if (op == "-") return number(a - b);
      if (op == "*") return number(a * b);
      if (op == "/" || op == "//" || op == "%") {
        if (b == 0) return Error(n, "division by zero");
        if (op == "/") return Value::Float(a / b);
        if (op == "//") return number(std::floor(a / b));
        return number(std::fmod(a, b));
      }
      if (op == "<") return Value::Bool(a < b);
      if (op == ">") return Value::Bool(a > b);
      if (op == "<=") return Value::Bool(a <= b);
      if (op == ">=") return Value::Bool(a >= b);
    } else if (left.is_list() && right.is_list()) {
      if (op == "+") {
        if (static_cast<int64_t>(left.list().size() + right.list().size()) >
            limits_.max_list_items) {
          return Exhausted(n, "a list grew past the size limit");
        }
        ValueList items = left.list();
        items.insert(items.end(), right.list().begin(), right.list().end());
        return Value::Array(std::move(items));
      }
    } else if (right.is_list()) {
      if (membership) {
        bool found = false;
        for (const Value& e : right.list()) {
          if (StrictEquals(e, left)) {
            found = true;
            break;
          }
        }
        return Value::Bool(op == "in" ? found : !found);
      }
    }
    if ((left.is_string() || right.is_string()) && op == "+") {
      ASSIGN_OR_RETURN(std::string a, Concat(n, left));
      ASSIGN_OR_RETURN(std::string b, Concat(n, right));
      return CheckedString(n, a + b);
    }
    if (left.is_string() && right.is_string() && membership) {
      const bool found = absl::StrContains(right.str(), left.str());
      return Value::Bool(op == "in" ? found : !found);
    }
    if (left.is_string() && right.is_mapping() && membership) {
      const bool found = right.map().Find(left.str()) != nullptr;
      return Value::Bool(op == "in" ? found : !found);
    }
    return Error(n, absl::StrCat("Unknown operator \"", op, "\" between ", left.TypeName(), " and ",
                                 right.TypeName()));
  }

  absl::StatusOr<std::string> Concat(const Node& n, const Value& v) {
    auto s = ToConcatString(v);
    if (!s.ok()) return Annotate(n, s.status());
    return s;
  }

  absl::StatusOr<Value> EvalSet(const Node& n, Scope& scope) {
    Value rhs;
    if (n.b) {
      ASSIGN_OR_RETURN(rhs, Eval(*n.b, scope));
    } else {
      ASSIGN_OR_RETURN(std::string body, EvalBlock(n.body, scope));
      rhs = Value::String(std::move(body));
    }
    const Node& target = *n.a;
    if (target.kind == NodeKind::kIdentifier) {
      scope.Set(target.text, std::move(rhs));
    } else if (target.kind == NodeKind::kTuple) {
      if (!rhs.is_list()) {
        return Error(n, absl::StrCat("Cannot unpack non-iterable type in set: ", rhs.TypeName()));
      }
      const ValueList& items = rhs.list();
      if (items.size() != target.list.size()) {
        return Error(n, absl::StrCat("Too ", target.list.size() > items.size() ? "few" : "many",
                                     " items to unpack in set"));
      }
      for (size_t i = 0; i < items.size(); ++i) scope.Set(target.list[i]->text, items[i]);
    } else {
      ASSIGN_OR_RETURN(Value object, Eval(*target.a, scope));
      if (object.kind() != Value::Kind::kNamespace) {
        return Error(n, "cannot assign attribute on non-namespace object");
      }
      object.map().Set(target.b->text, std::move(rhs));
    }
    return Value::Null();
  }

  absl::StatusOr<Value> EvalFor(const Node& n, Scope& outer) {
    Scope scope(&outer);
    const Node* iterable_node = n.b.get();
    const Node* test = nullptr;
    if (iterable_node->kind == NodeKind::kSelect) {
      test = iterable_node->b.get();
      iterable_node = iterable_node->a.get();
    }
    ASSIGN_OR_RETURN(Value iterable, Eval(*iterable_node, scope));
    if (iterable.is_mapping()) {
      ValueList keys;
      for (const auto& [k, v] : iterable.map().entries()) keys.push_back(Value::String(k));
      iterable = Value::Array(std::move(keys));
    } else if (!iterable.is_list()) {
      return Error(
          *iterable_node,
          absl::StrCat("Expected iterable or object type in for loop: got ", iterable.TypeName()));
    }
    const Node& target = *n.a;
    auto bind = [&](Scope& s, const Value& item) -> absl::Status {
      if (target.kind == NodeKind::kIdentifier) {
        s.Set(target.text, item);
        return absl::OkStatus();
      }
      if (item.kind() != Value::Kind::kArray) {
        return Error(target, absl::StrCat("Cannot unpack non-iterable type: ", item.TypeName()));
      }
      if (item.list().size() != target.list.size()) {
        return Error(target,
                     absl::StrCat("Too ", target.list.size() > item.list().size() ? "few" : "many",
                                  " items to unpack"));
      }
      for (size_t j = 0; j < target.list.size(); ++j) s.Set(target.list[j]->text, item.list()[j]);
      return absl::OkStatus();
    };
    // The items to iterate: all of them, or those passing the `if` test.
    ValueList filtered;
    for (const Value& item : iterable.list()) {
      RETURN_IF_ERROR(Step(n));
      if (target.kind == NodeKind::kTuple && item.kind() != Value::Kind::kArray) {
        return Error(target, absl::StrCat("Cannot unpack non-iterable type: ", item.TypeName()));
      }
      if (test != nullptr) {
        Scope loop_scope(&scope);
        RETURN_IF_ERROR(bind(loop_scope, item));
        ASSIGN_OR_RETURN(Value ok, Eval(*test, loop_scope));
        if (ok.Truthy()) filtered.push_back(item);
      }
    }
    const ValueList& items = test != nullptr ? filtered : iterable.list();
    std::string out;
    bool no_iteration = true;
    const double len = items.size();
    for (size_t i = 0; i < items.size(); ++i) {
      RETURN_IF_ERROR(Step(n));
      auto loop = std::make_shared<ValueMap>();
      loop->Set("index", Value::Int(i + 1));
      loop->Set("index0", Value::Int(i));
      loop->Set("revindex", Value::Int(len - i));
      loop->Set("revindex0", Value::Int(len - i - 1));
      loop->Set("first", Value::Bool(i == 0));
      loop->Set("last", Value::Bool(i + 1 == items.size()));
      loop->Set("length", Value::Int(len));
      loop->Set("previtem", i > 0 ? items[i - 1] : Value());
      loop->Set("nextitem", i + 1 < items.size() ? items[i + 1] : Value());
      scope.Set("loop", Value::Object(std::move(loop)));
      RETURN_IF_ERROR(bind(scope, items[i]));
      auto body = EvalBlock(n.body, scope);
      if (!body.ok()) {
        if (IsLoopControl(body.status())) {
          const Control c = control_;
          control_ = Control::kNone;
          if (c == Control::kContinue) continue;
          break;
        }
        return body.status();
      }
      out += *body;
      if (static_cast<int64_t>(out.size()) > limits_.max_output_bytes) {
        return Exhausted(n, absl::StrCat("the output grew past the limit of ",
                                         limits_.max_output_bytes, " bytes"));
      }
      no_iteration = false;
    }
    if (no_iteration) {
      ASSIGN_OR_RETURN(std::string otherwise, EvalBlock(n.alternate, scope));
      out += otherwise;
    }
    return Value::String(std::move(out));
  }

  // Binds a call's arguments to parameters in `scope`, as the reference does.
  absl::Status BindArguments(const Node& at, absl::string_view display,
                             const std::vector<NodePtr>& params, bool accepts_kwargs,
                             bool accepts_varargs, ValueList& args, Scope& scope) {
    ValueList positional = args;
    auto kwargs = std::make_shared<ValueMap>();
    if (!positional.empty() && positional.back().kind() == Value::Kind::kKwargs) {
      *kwargs = positional.back().map();
      positional.pop_back();
    }
    std::vector<const Node*> pending;
    for (size_t i = 0; i < params.size(); ++i) {
      const Node& p = *params[i];
      const std::string& name = p.text;
      std::optional<Value> value;
      if (i < positional.size()) value = positional[i];
      if (!value) {
        if (const Value* v = kwargs->Find(name)) {
          value = *v;
          kwargs->Erase(name);
        }
      }
      if (!value && p.kind == NodeKind::kKeywordArg) pending.push_back(&p);
      scope.Set(name, value ? *value : Value());
    }
    if (accepts_kwargs) {
      scope.Set("kwargs", Value::Object(kwargs));
    } else if (kwargs->size() > 0) {
      return Error(at, absl::StrCat("macro ", display, " takes no keyword argument '",
                                    kwargs->entries().front().first, "'"));
    }
    if (accepts_varargs) {
      ValueList rest;
      for (size_t i = params.size(); i < positional.size(); ++i) rest.push_back(positional[i]);
      scope.Set("varargs", Value::Array(std::move(rest)));
    } else if (positional.size() > params.size()) {
      return Error(at, absl::StrCat("macro ", display, " takes not more than ", params.size(),
                                    " argument(s)"));
    }
    for (const Node* p : pending) {
      ASSIGN_OR_RETURN(Value v, Eval(*p->a, scope));
      scope.Set(p->text, std::move(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> EvalMacro(const Node& n, Scope& scope) {
    bool uses_kwargs = false;
    bool uses_varargs = false;
    for (const NodePtr& s : n.body) CollectSpecialNames(*s, &uses_kwargs, &uses_varargs);
    for (const NodePtr& p : n.list) {
      if (p->text == "kwargs") uses_kwargs = false;
      if (p->text == "varargs") uses_varargs = false;
    }
    const Node* node = &n;
    scope.Set(
        n.text,
        Value::MakeFunction(MakeBuiltin(
            n.text,
            [this, node, uses_kwargs, uses_varargs](ValueList& args,
                                                    Scope* caller) -> absl::StatusOr<Value> {
              if (caller == nullptr) {
                return absl::InvalidArgumentError("a macro cannot be used as a filter");
              }
              Scope macro_scope(caller);
              RETURN_IF_ERROR(BindArguments(*node, absl::StrCat("'", node->text, "'"), node->list,
                                            uses_kwargs, uses_varargs, args, macro_scope));
              ASSIGN_OR_RETURN(std::string out, EvalBlock(node->body, macro_scope));
              return Value::String(std::move(out));
            })));
    return Value::Null();
  }

  absl::StatusOr<Value> EvalCallBlock(const Node& n, Scope& scope) {
    bool uses_kwargs = false;
    bool uses_varargs = false;
    for (const NodePtr& s : n.body) CollectSpecialNames(*s, &uses_kwargs, &uses_varargs);
    // `caller` may be stored somewhere and called after this block ends; the
    // flag turns that into an error instead of a use of a dead scope.
    auto alive = std::make_shared<bool>(true);
    const Node* node = &n;
    Scope* defining = &scope;
    Value caller = Value::MakeFunction(MakeBuiltin(
        "caller",
        [this, node, defining, alive, uses_kwargs, uses_varargs](ValueList& args,
                                                                 Scope*) -> absl::StatusOr<Value> {
          if (!*alive) {
            return absl::InvalidArgumentError("caller() used after its call block ended");
          }
          Scope block_scope(defining);
          RETURN_IF_ERROR(BindArguments(*node, "None", node->list, uses_kwargs, uses_varargs, args,
                                        block_scope));
          ASSIGN_OR_RETURN(std::string out, EvalBlock(node->body, block_scope));
          return Value::String(std::move(out));
        }));
    const Node& call = *n.a;
    ValueList args;
    ValueMap kwargs;
    RETURN_IF_ERROR(EvalArguments(call.list, scope, &args, &kwargs));
    args.push_back(Value::Kwargs(std::make_shared<ValueMap>(std::move(kwargs))));
    ASSIGN_OR_RETURN(Value fn, Eval(*call.a, scope));
    Scope env(&scope);
    env.Set("caller", caller);
    auto r = CallFunction(call, fn, args, env);
    *alive = false;
    return r;
  }

  absl::string_view source_;
  RenderLimits limits_;
  BuiltinLimits builtin_limits_;
  absl::Time now_;
  int64_t steps_ = 0;
  int depth_ = 0;
  int call_depth_ = 0;
  Control control_ = Control::kNone;
  int32_t control_offset_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Interpret(const Node& program, absl::string_view source,
                                      const ValueMap& variables, const RenderLimits& limits,
                                      absl::Time now) {
  Interpreter interpreter(source, limits, now);
  return interpreter.Run(program, variables);
}

}  // namespace tessera::text::jinja
