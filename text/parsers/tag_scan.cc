#include "text/parsers/tag_scan.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace tessera::text {

TagMatch FindFirstTag(absl::string_view text, absl::Span<const absl::string_view> tags,
                      size_t from) {
  TagMatch best;
  size_t best_len = 0;
  size_t i = 0;
  for (absl::string_view tag : tags) {
    size_t pos = text.find(tag, from);
    if (pos != absl::string_view::npos &&
        (pos < best.pos || (pos == best.pos && tag.size() > best_len))) {
      best.pos = pos;
      best.tag = i;
      best_len = tag.size();
    }
    ++i;
  }
  return best;
}

size_t PartialTagSuffix(absl::string_view text, absl::Span<const absl::string_view> tags) {
  size_t longest = 0;
  for (absl::string_view tag : tags) {
    // Candidate suffixes are shorter than the tag; try the longest first.
    size_t max_len = std::min(text.size(), tag.size() - 1);
    for (size_t len = max_len; len > longest; --len) {
      if (absl::StartsWith(tag, text.substr(text.size() - len))) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

absl::string_view TrimSpace(absl::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace tessera::text
