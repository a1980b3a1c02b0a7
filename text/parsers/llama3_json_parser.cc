#include "text/parsers/llama3_json_parser.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "text/parsers/tag_scan.h"
#include "text/parsers/tool_call_json.h"

namespace tessera::text {
namespace {

constexpr absl::string_view kPythonTag = "<|python_tag|>";
// A lead longer than this (e.g. pages of blank lines) is not a call.
constexpr size_t kMaxLead = 4096;

}  // namespace

Llama3JsonParser::Llama3JsonParser(uint64_t id_seed, size_t max_block_bytes)
    : max_block_bytes_(max_block_bytes), emitter_(id_seed) {}

Llama3JsonParser::Lead Llama3JsonParser::StepLead(char c) {
  lead_.push_back(c);
  if (lead_.size() > kMaxLead) return Lead::kNotACall;
  switch (lead_step_) {
    case LeadStep::kSeparators:
      if (IsSpace(c) || (c == ';' && state_ == State::kBetween)) return Lead::kNeedMore;
      if (c == '{') return Lead::kObject;
      if (c != kPythonTag[0]) return Lead::kNotACall;
      lead_step_ = LeadStep::kTag;
      tag_matched_ = 1;
      return Lead::kNeedMore;
    case LeadStep::kTag:
      if (c != kPythonTag[tag_matched_]) return Lead::kNotACall;
      if (++tag_matched_ == kPythonTag.size()) lead_step_ = LeadStep::kAfterTag;
      return Lead::kNeedMore;
    case LeadStep::kAfterTag:
      if (IsSpace(c)) return Lead::kNeedMore;
      return c == '{' ? Lead::kObject : Lead::kNotACall;
  }
  return Lead::kNotACall;
}

size_t Llama3JsonParser::SeparatorLength(size_t limit) const {
  size_t n = 0;
  while (state_ == State::kBetween && n < limit && (IsSpace(lead_[n]) || lead_[n] == ';')) {
    ++n;
  }
  return n;
}

void Llama3JsonParser::ResetLead() {
  lead_.clear();
  lead_step_ = LeadStep::kSeparators;
  tag_matched_ = 0;
}

void Llama3JsonParser::ToContent(absl::string_view text, ParsedDelta* out) {
  state_ = State::kContent;
  emitter_.Content(text, out);
}

size_t Llama3JsonParser::ScanObject(absl::string_view text, ParsedDelta* out) {
  size_t i = 0;
  bool closed = false;
  bool too_deep = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (escape_) {
      escape_ = false;
    } else if (in_string_) {
      if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      if (++depth_ > kMaxJsonDepth) {
        too_deep = true;
        ++i;
        break;
      }
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        closed = true;
        ++i;
        break;
      }
    }
  }
  object_.append(text.data(), i);
  if (closed) {
    std::optional<ParsedToolCall> call =
        object_.size() <= max_block_bytes_
            ? ParseToolCallObject(object_, /*require_arguments=*/true)
            : std::nullopt;
    if (call) {
      emitter_.Call(std::move(call->name), std::move(call->arguments), out);
      state_ = State::kBetween;
      ResetLead();
    } else {
      ToContent(raw_lead_ + object_, out);
    }
    object_.clear();
    raw_lead_.clear();
  } else if (too_deep || object_.size() > max_block_bytes_) {
    ToContent(raw_lead_ + object_, out);
    object_.clear();
    raw_lead_.clear();
  }
  return i;
}

ParsedDelta Llama3JsonParser::Feed(absl::string_view text) {
  ParsedDelta out;
  while (!text.empty()) {
    switch (state_) {
      case State::kContent:
        emitter_.Content(text, &out);
        return out;
      case State::kStart:
      case State::kBetween: {
        // One byte at a time through a small state machine: the outcome
        // cannot depend on how deltas are split, and each byte costs O(1).
        Lead lead = StepLead(text.front());
        text.remove_prefix(1);
        if (lead == Lead::kNotACall) {
          std::string held = lead_.substr(SeparatorLength(lead_.size()));
          ResetLead();
          ToContent(held, &out);
        } else if (lead == Lead::kObject) {
          size_t pos = lead_.size() - 1;  // the '{'
          size_t from = SeparatorLength(pos);
          raw_lead_ = lead_.substr(from, pos - from);
          ResetLead();
          object_.assign(1, '{');
          depth_ = 1;
          in_string_ = false;
          escape_ = false;
          state_ = State::kObject;
        }
        break;
      }
      case State::kObject:
        text.remove_prefix(ScanObject(text, &out));
        break;
    }
  }
  return out;
}

ParsedDelta Llama3JsonParser::Finish() {
  ParsedDelta out;
  switch (state_) {
    case State::kStart:
      emitter_.Content(lead_, &out);
      break;
    case State::kBetween: {
      emitter_.Content(absl::string_view(lead_).substr(SeparatorLength(lead_.size())), &out);
      break;
    }
    case State::kObject:
      emitter_.Content(raw_lead_ + object_, &out);
      break;
    case State::kContent:
      break;
  }
  lead_.clear();
  object_.clear();
  raw_lead_.clear();
  state_ = State::kContent;
  emitter_.Finish(&out);
  return out;
}

}  // namespace tessera::text
