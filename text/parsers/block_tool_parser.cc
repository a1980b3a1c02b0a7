#include "text/parsers/block_tool_parser.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

constexpr absl::string_view kDsCallsBegin =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "calls\xe2\x96\x81"
    "begin\xef\xbd\x9c>";
constexpr absl::string_view kDsCallsEnd =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "calls\xe2\x96\x81"
    "end\xef\xbd\x9c>";
constexpr absl::string_view kDsCallBegin =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "call\xe2\x96\x81"
    "begin\xef\xbd\x9c>";
constexpr absl::string_view kDsCallEnd =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "call\xe2\x96\x81"
    "end\xef\xbd\x9c>";
constexpr absl::string_view kDsSep =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "sep\xef\xbd\x9c>";

// Strips a Markdown code fence (```json … ```) around a JSON body.
absl::string_view StripFence(absl::string_view s) {
  s = TrimSpace(s);
  if (absl::StartsWith(s, "```")) {
    s.remove_prefix(3);
    if (absl::StartsWith(s, "json")) s.remove_prefix(4);
    s = TrimSpace(s);
    if (absl::EndsWith(s, "```")) s.remove_suffix(3);
  }
  return TrimSpace(s);
}

bool ValidName(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (IsSpace(c)) return false;
  }
  return true;
}

}  // namespace

std::optional<ParsedToolCall> ParseQwen3Body(absl::string_view body) {
  // Some fine-tunes wrap the object in a ```json fence; accept that too.
  return ParseToolCallObject(StripFence(body), /*require_arguments=*/false);
}

std::optional<ParsedToolCall> ParseDeepSeekBody(absl::string_view body) {
  size_t sep = body.find(kDsSep);
  if (sep == absl::string_view::npos) return std::nullopt;
  absl::string_view head = TrimSpace(body.substr(0, sep));
  absl::string_view tail = body.substr(sep + kDsSep.size());
  if (head == "function") {  // V3: the type, then NAME on its own line
    size_t newline = tail.find('\n');
    if (newline != absl::string_view::npos) {
      absl::string_view name = TrimSpace(tail.substr(0, newline));
      std::optional<std::string> args = CompactJsonObject(StripFence(tail.substr(newline + 1)));
      if (ValidName(name) && args) {
        return ParsedToolCall{std::string(name), std::move(*args)};
      }
    }
  }
  // V3.1: NAME, then the arguments object.
  std::optional<std::string> args = CompactJsonObject(StripFence(tail));
  if (!ValidName(head) || !args) return std::nullopt;
  return ParsedToolCall{std::string(head), std::move(*args)};
}

BlockFormat Qwen3BlockFormat() {
  BlockFormat f;
  f.call_begin = "<tool_call>";
  f.call_end = "</tool_call>";
  f.parse_body = ParseQwen3Body;
  return f;
}

BlockFormat DeepSeekV3BlockFormat() {
  BlockFormat f;
  f.section_begin = std::string(kDsCallsBegin);
  f.section_end = std::string(kDsCallsEnd);
  f.call_begin = std::string(kDsCallBegin);
  f.call_end = std::string(kDsCallEnd);
  f.parse_body = ParseDeepSeekBody;
  return f;
}

BlockToolParser::BlockToolParser(BlockFormat format, uint64_t id_seed, size_t max_block_bytes)
    : format_(std::move(format)), max_block_bytes_(max_block_bytes), emitter_(id_seed) {}

ParsedDelta BlockToolParser::Feed(absl::string_view text) {
  ParsedDelta out;
  buf_.append(text.data(), text.size());
  Drain(/*final=*/false, &out);
  return out;
}

ParsedDelta BlockToolParser::Finish() {
  ParsedDelta out;
  Drain(/*final=*/true, &out);
  if (state_ == State::kSection && !section_had_call_) {
    if (section_tag_pending_) emitter_.Content(format_.section_begin, &out);
    emitter_.Content(section_space_, &out);
  }
  section_space_.clear();
  emitter_.Finish(&out);
  return out;
}

void BlockToolParser::SectionContent(absl::string_view text, ParsedDelta* out) {
  if (text.empty()) return;
  bool all_space = TrimSpace(text).empty();
  if (all_space && !section_space_committed_) {
    // Whitespace between calls: dropped if a call follows, else content.
    section_space_.append(text.data(), text.size());
    if (section_space_.size() <= ToolCallEmitter::kMaxHeldWhitespace) return;
    section_space_committed_ = true;
    text = absl::string_view();
  }
  if (!all_space) section_space_committed_ = false;
  if (section_tag_pending_ && !section_had_call_) {
    emitter_.Content(format_.section_begin, out);
  }
  section_tag_pending_ = false;
  emitter_.Content(section_space_, out);
  section_space_.clear();
  emitter_.Content(text, out);
}

void BlockToolParser::ReleaseRaw(absl::string_view text, ParsedDelta* out) {
  if (call_in_section_) {
    SectionContent(text, out);
  } else {
    emitter_.Content(text, out);
  }
}

void BlockToolParser::Drain(bool final, ParsedDelta* out) {
  const absl::string_view call_begin = format_.call_begin;
  const absl::string_view call_end = format_.call_end;
  const bool has_section = !format_.section_begin.empty();
  // `done` is how much of buf_ has been consumed; erased once at the end.
  size_t done = 0;
  while (true) {
    absl::string_view rest = absl::string_view(buf_).substr(done);
    switch (state_) {
      case State::kOutside:
      case State::kSection: {
        const bool outside = state_ == State::kOutside;
        // The tags that can come next, and what each one means.
        enum class Kind { kSectionBegin, kSectionEnd, kCallBegin };
        absl::string_view tags[2];
        Kind kinds[2];
        size_t n = 0;
        auto expect = [&](absl::string_view tag, Kind kind) {
          tags[n] = tag;
          kinds[n++] = kind;
        };
        if (outside && has_section) {
          expect(format_.section_begin, Kind::kSectionBegin);
        }
        expect(call_begin, Kind::kCallBegin);
        if (!outside) expect(format_.section_end, Kind::kSectionEnd);
        const absl::Span<const absl::string_view> expected(tags, n);

        TagMatch m = FindFirstTag(rest, expected);
        if (m.pos == std::string::npos) {
          size_t keep = final ? 0 : PartialTagSuffix(rest, expected);
          absl::string_view text = rest.substr(0, rest.size() - keep);
          if (outside) {
            emitter_.Content(text, out);
          } else {
            SectionContent(text, out);
          }
          done += text.size();
          buf_.erase(0, done);
          return;
        }
        absl::string_view before = rest.substr(0, m.pos);
        if (outside) {
          emitter_.Content(before, out);
        } else {
          SectionContent(before, out);  // stray text between calls
        }
        done += m.pos + tags[m.tag].size();
        switch (kinds[m.tag]) {
          case Kind::kCallBegin:
            call_in_section_ = !outside;
            state_ = State::kCall;
            scan_from_ = 0;
            buf_.erase(0, done);
            done = 0;
            break;
          case Kind::kSectionBegin:
            state_ = State::kSection;
            section_tag_pending_ = true;
            section_had_call_ = false;
            section_space_.clear();
            section_space_committed_ = false;
            break;
          case Kind::kSectionEnd:
            // A section in which nothing parsed keeps its tags as content.
            if (!section_had_call_) SectionContent(format_.section_end, out);
            section_space_.clear();
            state_ = State::kOutside;
            break;
        }
        break;
      }
      case State::kCall: {
        // buf_ holds only the body here (done == 0).
        size_t pos = buf_.find(call_end.data(), scan_from_, call_end.size());
        if (pos == std::string::npos) {
          bool overflow = buf_.size() > max_block_bytes_ + call_end.size();
          if (!final && !overflow) {
            scan_from_ = buf_.size() >= call_end.size() ? buf_.size() - call_end.size() + 1 : 0;
            return;
          }
          // Never closed (or too long to keep): it is content.
          ReleaseRaw(absl::StrCat(call_begin, buf_), out);
          buf_.clear();
          state_ = call_in_section_ ? State::kSection : State::kOutside;
          if (!final) return;
          break;
        }
        absl::string_view body = absl::string_view(buf_).substr(0, pos);
        std::optional<ParsedToolCall> call;
        if (body.size() <= max_block_bytes_) call = format_.parse_body(body);
        if (call) {
          emitter_.Call(std::move(call->name), std::move(call->arguments), out);
          if (call_in_section_) {
            section_had_call_ = true;
            section_space_.clear();
            section_space_committed_ = false;
          }
        } else {
          ReleaseRaw(absl::StrCat(call_begin, body, call_end), out);
        }
        done = pos + call_end.size();
        state_ = call_in_section_ ? State::kSection : State::kOutside;
        break;
      }
    }
  }
}

}  // namespace tessera::text
