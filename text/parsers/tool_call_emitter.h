// The output side shared by the tool-call parsers: numbers calls, gives them
// ids, and applies the whitespace rule to content.
//
// Whitespace rule: whitespace that touches a parsed tool call is not content
// (the newlines a model writes before, between and after `<tool_call>`
// blocks). So trailing whitespace of content is held until non-whitespace
// content follows (then sent) or a call follows (then dropped), and leading
// whitespace after a call is dropped. A whitespace run longer than
// kMaxHeldWhitespace is sent as it comes, to bound memory; the outcome
// depends only on the text, never on how it was split into deltas.
//
// Ids: "call_" + 24 characters of [0-9a-z] from a splitmix64 stream seeded
// by id_seed (0: std::random_device).
//
// Thread-safety: not thread-safe; one instance per parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "text/parsers/output_parser.h"

namespace tessera::text {

class ToolCallEmitter {
 public:
  static constexpr size_t kMaxHeldWhitespace = 4096;

  explicit ToolCallEmitter(uint64_t id_seed);

  void Content(absl::string_view text, ParsedDelta* out);
  void Call(std::string name, std::string arguments, ParsedDelta* out);
  // Sends held whitespace (the output ended without a call after it).
  void Finish(ParsedDelta* out);

  int calls() const { return next_index_; }

 private:
  std::string NextId();

  std::string held_space_;
  bool space_committed_ = false;  // current run is long: send it directly
  bool drop_leading_space_ = false;
  int next_index_ = 0;
  uint64_t rng_;
};

}  // namespace tessera::text
