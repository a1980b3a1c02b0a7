// Finding tags in streamed text: the earliest complete tag, and how many
// trailing bytes must be held back because they could be the start of one.
// Used by the reasoning and tool-call parsers.
//
// Thread-safety: pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::text {

struct TagMatch {
  size_t pos = std::string::npos;  // npos: no complete tag
  size_t tag = 0;                  // index into the tag list
};

// Earliest complete occurrence at or after `from` of any of `tags`; at equal
// positions the longer tag wins. REQUIRES: tags non-empty.
TagMatch FindFirstTag(absl::string_view text, absl::Span<const absl::string_view> tags,
                      size_t from = 0);

// Length of the longest suffix of `text` that is a proper prefix of one of
// `tags` (0 when none): the bytes to hold back until the next delta tells
// whether a tag starts there.
size_t PartialTagSuffix(absl::string_view text, absl::Span<const absl::string_view> tags);

// True for the JSON whitespace bytes: space, tab, CR, LF.
inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
absl::string_view TrimSpace(absl::string_view s);

}  // namespace tessera::text
