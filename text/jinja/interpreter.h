// Evaluator of a parsed Jinja template (ast.h) over runtime values.
//
// Mirrors @huggingface/jinja's runtime: scoping (a for loop has its own
// scope; `if` does not; macros see the variables of their call site),
// `loop` (index, index0, revindex, revindex0, first, last, length,
// previtem, nextitem), `for ... if ...` and `else`, break/continue, macros
// with defaults, varargs and kwargs, `{% call %}` with `caller()`,
// `{% filter %}` blocks, namespaces, and the globals namespace(),
// raise_exception(), range() and strftime_now().
//
// Every render is bounded (RenderLimits): the number of evaluation steps,
// the output and string sizes, list lengths, macro call depth and evaluation
// depth. Exceeding a bound is a ResourceExhausted error, never a hang.
// Errors name the template line and column of the expression that failed.
//
// Thread-safety: Interpret() may run concurrently on the same tree; each
// call has its own scopes and values.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace tessera::text::jinja {

struct RenderLimits {
  int64_t max_output_bytes = 8 << 20;  // also caps any single string value
  int64_t max_steps = 2'000'000;       // evaluated nodes plus loop iterations (~1 s)
  int64_t max_list_items = 100'000;    // lists built by range(), +, split ...
  int max_call_depth = 64;             // nested macro calls
  int max_eval_depth = 1000;           // nested evaluation (expressions within calls)
  int max_input_depth = 64;            // nesting of the JSON variables
};

// A variable scope; `parent` is the enclosing one (null for the globals).
class Scope {
 public:
  explicit Scope(Scope* parent) : parent_(parent) {}
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  // The value of `name` here or in an enclosing scope; undefined if none.
  Value Lookup(absl::string_view name) const;
  bool HasLocal(absl::string_view name) const { return vars_.contains(name); }
  void Set(absl::string_view name, Value value) { vars_[std::string(name)] = std::move(value); }

 private:
  Scope* parent_;
  absl::flat_hash_map<std::string, Value> vars_;
};

// Renders `program` (a kProgram node parsed from `source`, which is used for
// error positions) with `variables` defined in the global scope next to the
// builtins. `now` is what strftime_now() formats (in the local time zone).
absl::StatusOr<std::string> Interpret(const Node& program, absl::string_view source,
                                      const ValueMap& variables, const RenderLimits& limits,
                                      absl::Time now);

}  // namespace tessera::text::jinja
