// Parser from tokens to the syntax tree (ast.h).
//
// Follows @huggingface/jinja's grammar and operator precedence (the reference
// renderer of chat templates), and rejects at load time what the interpreter
// does not implement: unknown statements (include, import, extends, block,
// raw, with, ...), unknown filters and tests, invalid assignment targets.
// Nesting is bounded (kMaxNesting) so hostile templates cannot exhaust the
// stack. Errors are InvalidArgument naming the line and column.
//
// Thread-safety: pure function.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace tessera::text::jinja {

inline constexpr int kMaxNesting = 200;

// `source` is only used to describe error positions.
absl::StatusOr<NodePtr> Parse(const std::vector<Token>& tokens, absl::string_view source);

// The filters and tests the interpreter implements (checked at parse time).
bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

}  // namespace tessera::text::jinja
