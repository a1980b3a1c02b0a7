// Llama-3.1/3.2 JSON tool calling: the whole output is one or more JSON
// objects `{"name": …, "parameters": {…}}` ("arguments" also accepted),
// each optionally preceded by `<|python_tag|>`, separated by `;` and/or
// whitespace.
//
// The output is a tool call only when, after leading whitespace, it begins
// with `{` or `<|python_tag|>`; otherwise everything is content, decided
// after at most that many bytes. Objects are delimited by a bracket scanner
// that knows JSON strings and escapes, so a call is emitted as soon as its
// closing brace arrives. The first object that does not parse as a call
// (or nests deeper than kMaxJsonDepth, or grows past max_block_bytes), and
// any non-separator text after a call, turns the rest of the output into
// content verbatim; calls already emitted stay emitted.
//
// Thread-safety: not thread-safe; one instance per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "text/parsers/output_parser.h"
#include "text/parsers/tool_call_emitter.h"

namespace tessera::text {

class Llama3JsonParser : public OutputParser {
 public:
  Llama3JsonParser(uint64_t id_seed, size_t max_block_bytes);

  ParsedDelta Feed(absl::string_view text) override;
  ParsedDelta Finish() override;

 private:
  enum class State { kStart, kBetween, kObject, kContent };
  enum class Lead { kNeedMore, kObject, kNotACall };
  enum class LeadStep { kSeparators, kTag, kAfterTag };

  // Appends one byte to lead_ (whitespace, ';' after a call, the python
  // tag, whitespace) and says whether an object starts with it.
  Lead StepLead(char c);
  void ResetLead();
  // Scans object bytes; returns how many of `text` it consumed.
  size_t ScanObject(absl::string_view text, ParsedDelta* out);
  // After a call: how many leading bytes of lead_ (up to `limit`) are the
  // call's separators (whitespace and ';'), which are never content.
  size_t SeparatorLength(size_t limit) const;
  void ToContent(absl::string_view text, ParsedDelta* out);

  const size_t max_block_bytes_;
  ToolCallEmitter emitter_;
  State state_ = State::kStart;
  std::string lead_;      // kStart/kBetween: whitespace, ';', python tag
  std::string raw_lead_;  // the lead of the current object, for fallback
  LeadStep lead_step_ = LeadStep::kSeparators;
  size_t tag_matched_ = 0;  // bytes of the python tag matched so far
  std::string object_;      // kObject: the object so far
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
};

}  // namespace tessera::text
