// Streaming output parsers: turn a model's detokenized output, fed as text
// deltas split anywhere (inside a tag, inside JSON, inside a UTF-8
// sequence), into content, reasoning and OpenAI-style tool-call deltas.
//
//   auto parser = MakeOutputParser({.tool_format = "qwen3",
//                                   .reasoning = true});
//   for (each detokenized delta) Send((*parser)->Feed(delta));
//   Send((*parser)->Finish());
//
// Reasoning is split first (`<think>…</think>` goes to `reasoning`); tool
// calls are parsed in what remains. Text that does not parse as a tool call
// (malformed JSON, wrong shape, a block never closed, a block over
// `max_block_bytes`) stays content: nothing is dropped except the tags of
// calls that parsed and the whitespace that touches such a call.
//
// Streaming shape: a tool call is emitted as ONE ToolCallDelta carrying
// index, id, name and the complete arguments, at the moment its block closes
// and validates. Name and id are not sent earlier on purpose: a call whose
// header was streamed cannot be withdrawn when its body then fails to parse,
// and the contract here is that unparsable text reaches the client as
// content. Arguments are the compact serialization of the parsed JSON object,
// so they are always valid JSON.
//
// Thread-safety: an OutputParser is used by one request at a time and is not
// thread-safe; distinct parsers share nothing. The free functions are
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::text {

// One streamed piece of a tool call, as in OpenAI's `delta.tool_calls[]`.
// `id` and `name` are set on the first delta of a call (here: its only one).
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ParsedDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

// A whole message assembled from deltas (for non-streaming responses).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  bool operator==(const ToolCall&) const = default;
};
struct ParsedMessage {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedMessage&) const = default;
};
// Appends `delta` to `message`: content and reasoning concatenate; a tool
// call delta with a new index starts a call, later ones append arguments.
void Accumulate(const ParsedDelta& delta, ParsedMessage* message);

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Consumes the next piece of output. Holds back only bytes that could
  // still be the start of a tag (or a tool-call block being collected).
  virtual ParsedDelta Feed(absl::string_view text) = 0;
  // End of output: flushes everything held back. REQUIRES: called once,
  // after the last Feed.
  virtual ParsedDelta Finish() = 0;
};

struct OutputParserOptions {
  // One of KnownToolFormats(): "none", "qwen3", "llama3_json", "deepseek_v3".
  std::string tool_format = "none";
  // Split `<think>…</think>` into reasoning.
  bool reasoning = false;
  // The prompt already opened `<think>` (Qwen3 with thinking on, DeepSeek-R1
  // style): output starts as reasoning until `</think>`. Implies reasoning.
  bool starts_in_reasoning = false;
  // Seeds tool-call ids: nonzero gives the same ids for the same seed (tests,
  // reproducible runs); 0 draws them from std::random_device.
  uint64_t id_seed = 0;
  // A tool-call block (or a Llama JSON object) longer than this is released
  // as content instead of being buffered further.
  size_t max_block_bytes = size_t{1} << 20;
};

// Returns the names MakeOutputParser accepts, in a fixed order.
const std::vector<std::string>& KnownToolFormats();

// Unknown tool_format -> INVALID_ARGUMENT naming the known ones.
absl::StatusOr<std::unique_ptr<OutputParser>> MakeOutputParser(const OutputParserOptions& options);

// The tool-call format a model's files imply. Rule, first match wins:
//  1. the chat template (if non-empty) mentions `<｜tool▁call▁begin｜>` or
//     `<｜tool▁calls▁begin｜>` -> "deepseek_v3";
//  2. it mentions `<tool_call>` -> "qwen3";
//  3. it mentions `<|python_tag|>`, or it is a Llama-3 header template
//     (`<|start_header_id|>`) that mentions `tools` -> "llama3_json";
//  4. a non-empty template matching none of these -> "none" (the template
//     is what the model was trained to answer; it shows no tool format);
//  5. with no template, config.json's model_type: "deepseek_v3" ->
//     "deepseek_v3"; "qwen2", "qwen2_moe", "qwen3", "qwen3_moe" -> "qwen3";
//     anything else (including "llama": Llama 2 has no tool calls) -> "none".
std::string DefaultToolFormat(absl::string_view model_type, absl::string_view chat_template);

// True when a rendered prompt ends (ignoring trailing whitespace) with
// `<think>`: the template opened reasoning, so the parser should be made
// with starts_in_reasoning.
bool PromptOpensReasoning(absl::string_view rendered_prompt);

}  // namespace tessera::text
