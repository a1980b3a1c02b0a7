// Tool calls written as tagged blocks: Qwen3/Qwen2.5/Hermes
// `<tool_call>{json}</tool_call>` and DeepSeek-V3's
// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>…<｜tool▁call▁end｜>…
// <｜tool▁calls▁end｜>`. One engine, configured by a BlockFormat.
//
// Outside a block, text is content as soon as it cannot be the start of a
// tag. Inside a call block, text is buffered until the end tag, then handed
// to `parse_body`; a body that does not parse, a block still open at Finish,
// or a body longer than max_block_bytes is released as content verbatim
// (tags included). Memory is bounded by max_block_bytes plus a tag; the end
// tag is searched only in bytes not searched before, so a long block costs
// linear time.
//
// Thread-safety: not thread-safe; one instance per request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "text/parsers/output_parser.h"
#include "text/parsers/tool_call_emitter.h"
#include "text/parsers/tool_call_json.h"

namespace tessera::text {

struct BlockFormat {
  // Optional section around the calls (DeepSeek); empty = none. A call
  // block is also recognised outside a section.
  std::string section_begin;
  std::string section_end;
  std::string call_begin;
  std::string call_end;
  // The text between call_begin and call_end -> a call, or nullopt.
  std::function<std::optional<ParsedToolCall>(absl::string_view body)> parse_body;
};

BlockFormat Qwen3BlockFormat();
BlockFormat DeepSeekV3BlockFormat();

// The body parsers, exposed for tests.
std::optional<ParsedToolCall> ParseQwen3Body(absl::string_view body);
// V3: `function<｜tool▁sep｜>NAME\n```json\n{…}\n```` (fence optional);
// V3.1: `NAME<｜tool▁sep｜>{…}`.
std::optional<ParsedToolCall> ParseDeepSeekBody(absl::string_view body);

class BlockToolParser : public OutputParser {
 public:
  BlockToolParser(BlockFormat format, uint64_t id_seed, size_t max_block_bytes);

  ParsedDelta Feed(absl::string_view text) override;
  ParsedDelta Finish() override;

 private:
  enum class State { kOutside, kSection, kCall };

  void Drain(bool final, ParsedDelta* out);
  // Content seen inside a section: the section's opening tag goes first
  // when no call of the section has parsed yet, so nothing is lost.
  void SectionContent(absl::string_view text, ParsedDelta* out);
  void ReleaseRaw(absl::string_view text, ParsedDelta* out);

  const BlockFormat format_;
  const size_t max_block_bytes_;
  ToolCallEmitter emitter_;
  State state_ = State::kOutside;
  bool call_in_section_ = false;
  bool section_tag_pending_ = false;  // section opened, its tag not yet sent
  bool section_had_call_ = false;
  std::string section_space_;             // whitespace in a section, not yet decided
  bool section_space_committed_ = false;  // long run: sent as it comes
  std::string buf_;                       // kCall: the body so far; else: held-back bytes
  size_t scan_from_ = 0;                  // kCall: where the search for call_end resumes
};

}  // namespace tessera::text
