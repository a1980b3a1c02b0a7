// Validating the JSON inside a tool-call block and producing the compact
// arguments string OpenAI clients expect. Never throws: malformed or oddly
// shaped input yields std::nullopt, and the caller keeps the text as content.
//
// Thread-safety: pure functions, safe from any thread.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera::text {

// Deeper JSON than this is refused before parsing (bounds recursion in the
// JSON library's serializer).
inline constexpr int kMaxJsonDepth = 128;

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON object
};

// `text` (surrounding whitespace allowed) must be one JSON object with a
// non-empty string "name" and arguments under "arguments" or, failing that,
// "parameters": an object, a string holding a JSON object, or null or an
// empty string (-> {}).
// Without either key: {} unless `require_arguments`. Other keys are ignored.
std::optional<ParsedToolCall> ParseToolCallObject(absl::string_view text, bool require_arguments);

// `text` (surrounding whitespace allowed) must be one JSON object; returns
// its compact serialization.
std::optional<std::string> CompactJsonObject(absl::string_view text);

// False when brackets outside strings nest deeper than `max_depth`.
bool JsonDepthWithin(absl::string_view text, int max_depth);

}  // namespace tessera::text
