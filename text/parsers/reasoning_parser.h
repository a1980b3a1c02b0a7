// Splits streamed output into reasoning (inside `<think>…</think>`) and
// content. Implements OutputParser; its deltas never carry tool calls.
//
// Output may start inside reasoning (the prompt opened `<think>`), in which
// case only `</think>` is expected first. Several blocks are allowed: after
// `</think>`, a later `<think>` opens reasoning again. Tags are removed; all
// other bytes reach exactly one of the two streams, in order. A tag split
// across deltas is held back, but never more bytes than could begin the tag
// that would end the current stream. At Finish, held bytes go to the
// current stream (an unclosed `<think>` leaves its text as reasoning: the
// output was cut off while the model was thinking).
//
// Thread-safety: not thread-safe; one instance per request.
#pragma once

#include <string>

#include "text/parsers/output_parser.h"

namespace tessera::text {

class ReasoningParser : public OutputParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning)
      : in_reasoning_(starts_in_reasoning) {}

  ParsedDelta Feed(absl::string_view text) override;
  ParsedDelta Finish() override;

 private:
  void Drain(bool final, ParsedDelta* out);

  bool in_reasoning_;
  std::string pending_;  // at most one tag's length minus one between calls
};

}  // namespace tessera::text
