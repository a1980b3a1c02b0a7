#include "text/parsers/reasoning_parser.h"

#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";

}  // namespace

ParsedDelta ReasoningParser::Feed(absl::string_view text) {
  ParsedDelta out;
  pending_.append(text.data(), text.size());
  Drain(/*final=*/false, &out);
  return out;
}

ParsedDelta ReasoningParser::Finish() {
  ParsedDelta out;
  Drain(/*final=*/true, &out);
  return out;
}

void ReasoningParser::Drain(bool final, ParsedDelta* out) {
  absl::string_view rest = pending_;
  while (!rest.empty()) {
    absl::string_view tag = in_reasoning_ ? kClose : kOpen;
    std::string& sink = in_reasoning_ ? out->reasoning : out->content;
    size_t pos = rest.find(tag);
    if (pos != absl::string_view::npos) {
      sink.append(rest.data(), pos);
      rest.remove_prefix(pos + tag.size());
      in_reasoning_ = !in_reasoning_;
      continue;
    }
    size_t keep = final ? 0 : PartialTagSuffix(rest, {tag});
    sink.append(rest.data(), rest.size() - keep);
    rest.remove_prefix(rest.size() - keep);
    break;
  }
  pending_ = std::string(rest);
}

}  // namespace tessera::text
