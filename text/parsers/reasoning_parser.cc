#include "text/parsers/reasoning_parser.h"

#include "absl/strings/match.h"
#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";
// Leading whitespace longer than this means no opening tag is coming.
constexpr size_t kMaxLeadingSpace = 4096;

}  // namespace

ParsedDelta ReasoningParser::Feed(absl::string_view text) {
  ParsedDelta out;
  if (state_ == State::kContent) {  // the common case after reasoning
    out.content = std::string(text);
    return out;
  }
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
  if (state_ == State::kStart) {
    size_t lead = 0;
    while (lead < rest.size() && IsSpace(rest[lead])) ++lead;
    absl::string_view head = rest.substr(lead);
    const bool may_open = lead <= kMaxLeadingSpace;
    if (may_open && !final && head.size() < kOpen.size() && absl::StartsWith(kOpen, head)) {
      return;  // could still become "<think>": keep holding
    }
    if (may_open && absl::StartsWith(head, kOpen)) {
      rest = head.substr(kOpen.size());
      state_ = State::kReasoning;
    } else {
      state_ = starts_in_reasoning_ ? State::kReasoning : State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    size_t pos = rest.find(kClose);
    if (pos == absl::string_view::npos) {
      size_t keep = final ? 0 : PartialTagSuffix(rest, {kClose});
      out->reasoning.append(rest.data(), rest.size() - keep);
      pending_ = std::string(rest.substr(rest.size() - keep));
      return;
    }
    out->reasoning.append(rest.data(), pos);
    rest.remove_prefix(pos + kClose.size());
    state_ = State::kContent;
  }
  out->content.append(rest.data(), rest.size());
  pending_.clear();
}

}  // namespace tessera::text
