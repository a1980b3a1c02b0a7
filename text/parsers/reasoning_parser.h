// Splits streamed output into reasoning (inside `<think>…</think>`) and
// content. Implements OutputParser; its deltas never carry tool calls.
//
// One reasoning block, at the start, as Qwen3 and DeepSeek-R1 write it:
// `<think>` opens it only as the first non-whitespace of the output (that
// whitespace is dropped); with starts_in_reasoning (the prompt already
// opened `<think>`) the output is reasoning from its first byte, and a
// leading `<think>` the model repeats anyway is dropped. The first
// `</think>` ends reasoning; everything after it is content, including any
// later `<think>` (so a tag quoted in an answer or in tool-call arguments is
// never swallowed). Tags split across deltas are held back, but never more
// bytes than could still begin the tag. At Finish, held bytes go to the
// current stream; an unclosed block stays reasoning (the output was cut off
// while the model was thinking).
//
// Thread-safety: not thread-safe; one instance per request.
#pragma once

#include <string>

#include "text/parsers/output_parser.h"

namespace tessera::text {

class ReasoningParser : public OutputParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning) : starts_in_reasoning_(starts_in_reasoning) {}

  ParsedDelta Feed(absl::string_view text) override;
  ParsedDelta Finish() override;

 private:
  enum class State { kStart, kReasoning, kContent };

  void Drain(bool final, ParsedDelta* out);

  const bool starts_in_reasoning_;
  State state_ = State::kStart;
  std::string pending_;  // kStart: leading whitespace and a partial tag
};

}  // namespace tessera::text
