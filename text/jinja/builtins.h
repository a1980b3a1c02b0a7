// Built-in filters, tests and methods of the Jinja interpreter.
//
// Each behaves as in @huggingface/jinja, the reference renderer of chat
// templates: `x | name` and `x | name(args)` filters (dispatched on the
// operand's type), `x is name` tests, string methods (`s.strip()`,
// `s.split(sep, maxsplit)`, `s.startswith(...)`, ...) and mapping methods
// (`d.get(k, default)`, `d.items()`, ...). Where the reference would print a
// JavaScript artefact instead of text (e.g. "[object Map]") the builtin fails
// with an error instead.
//
// Thread-safety: stateless functions.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace tessera::text::jinja {

// Caps on what a single builtin may build (strings, lists).
struct BuiltinLimits {
  int64_t max_string_bytes = 8 << 20;
  int64_t max_list_items = 100'000;
};

// `operand | name` (called == false) or `operand | name(args, kwargs)`.
// `literal_args` says whether every argument was a string literal (the
// reference requires that of selectattr/rejectattr).
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& operand, bool called,
                                  const ValueList& args, const ValueMap& kwargs,
                                  bool literal_args, const BuiltinLimits& limits);

// `operand is name`; `arg` is the extra value selectattr passes, or null.
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& operand, const Value* arg);

// `object.name` when `name` is not a key of the object: string methods and
// `length`, mapping methods, a list's `length`. Undefined when none.
Value BuiltinMember(const Value& object, absl::string_view name, const BuiltinLimits& limits);

// Three-way comparison used by sort and dictsort (numbers, or strings of the
// same kind; other mixes are errors).
absl::StatusOr<int> CompareValues(const Value& a, const Value& b, bool case_sensitive);

}  // namespace tessera::text::jinja
