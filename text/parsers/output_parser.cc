#include "text/parsers/output_parser.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "text/parsers/block_tool_parser.h"
#include "text/parsers/llama3_json_parser.h"
#include "text/parsers/reasoning_parser.h"
#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

class PassThroughParser : public OutputParser {
 public:
  ParsedDelta Feed(absl::string_view text) override {
    ParsedDelta out;
    out.content = std::string(text);
    return out;
  }
  ParsedDelta Finish() override { return {}; }
};

// Reasoning first; the tool parser sees only the content stream.
class ComposedParser : public OutputParser {
 public:
  ComposedParser(std::unique_ptr<OutputParser> reasoning, std::unique_ptr<OutputParser> tools)
      : reasoning_(std::move(reasoning)), tools_(std::move(tools)) {}

  ParsedDelta Feed(absl::string_view text) override {
    return Chain(reasoning_->Feed(text), /*final=*/false);
  }
  ParsedDelta Finish() override { return Chain(reasoning_->Finish(), /*final=*/true); }

 private:
  ParsedDelta Chain(ParsedDelta first, bool final) {
    ParsedDelta out;
    if (!first.content.empty()) out = tools_->Feed(first.content);
    if (final) {
      ParsedDelta last = tools_->Finish();
      out.content += last.content;
      for (ToolCallDelta& call : last.tool_calls) {
        out.tool_calls.push_back(std::move(call));
      }
    }
    out.reasoning = std::move(first.reasoning);
    return out;
  }

  std::unique_ptr<OutputParser> reasoning_;
  std::unique_ptr<OutputParser> tools_;
};

constexpr absl::string_view kDsCallBegin =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "call\xe2\x96\x81"
    "begin\xef\xbd\x9c>";
constexpr absl::string_view kDsCallsBegin =
    "<\xef\xbd\x9ctool\xe2\x96\x81"
    "calls\xe2\x96\x81"
    "begin\xef\xbd\x9c>";

}  // namespace

void Accumulate(const ParsedDelta& delta, ParsedMessage* message) {
  message->content += delta.content;
  message->reasoning += delta.reasoning;
  for (const ToolCallDelta& call : delta.tool_calls) {
    if (call.index < 0) continue;
    size_t index = static_cast<size_t>(call.index);
    if (index >= message->tool_calls.size()) {
      message->tool_calls.resize(index + 1);
    }
    ToolCall& target = message->tool_calls[index];
    if (!call.id.empty()) target.id = call.id;
    if (!call.name.empty()) target.name = call.name;
    target.arguments += call.arguments;
  }
}

const std::vector<std::string>& KnownToolFormats() {
  static const std::vector<std::string>* formats =
      new std::vector<std::string>{"none", "qwen3", "llama3_json", "deepseek_v3"};
  return *formats;
}

absl::StatusOr<std::unique_ptr<OutputParser>> MakeOutputParser(const OutputParserOptions& options) {
  std::unique_ptr<OutputParser> tools;
  const std::string& format = options.tool_format;
  if (format == "none") {
    tools = std::make_unique<PassThroughParser>();
  } else if (format == "qwen3") {
    tools = std::make_unique<BlockToolParser>(Qwen3BlockFormat(), options.id_seed,
                                              options.max_block_bytes);
  } else if (format == "llama3_json") {
    tools = std::make_unique<Llama3JsonParser>(options.id_seed, options.max_block_bytes);
  } else if (format == "deepseek_v3") {
    tools = std::make_unique<BlockToolParser>(DeepSeekV3BlockFormat(), options.id_seed,
                                              options.max_block_bytes);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tool-call format \"", format,
                     "\"; known formats: ", absl::StrJoin(KnownToolFormats(), ", ")));
  }
  if (!options.reasoning && !options.starts_in_reasoning) return tools;
  return std::unique_ptr<OutputParser>(std::make_unique<ComposedParser>(
      std::make_unique<ReasoningParser>(options.starts_in_reasoning), std::move(tools)));
}

std::string DefaultToolFormat(absl::string_view model_type, absl::string_view chat_template) {
  if (!chat_template.empty()) {
    if (absl::StrContains(chat_template, kDsCallBegin) ||
        absl::StrContains(chat_template, kDsCallsBegin)) {
      return "deepseek_v3";
    }
    if (absl::StrContains(chat_template, "<tool_call>")) return "qwen3";
    if (absl::StrContains(chat_template, "<|python_tag|>") ||
        (absl::StrContains(chat_template, "<|start_header_id|>") &&
         absl::StrContains(chat_template, "tools"))) {
      return "llama3_json";
    }
    return "none";
  }
  if (model_type == "deepseek_v3") return "deepseek_v3";
  if (model_type == "qwen2" || model_type == "qwen2_moe" || model_type == "qwen3" ||
      model_type == "qwen3_moe") {
    return "qwen3";
  }
  return "none";
}

bool PromptOpensReasoning(absl::string_view rendered_prompt) {
  size_t end = rendered_prompt.size();
  while (end > 0 && IsSpace(rendered_prompt[end - 1])) --end;
  return absl::EndsWith(rendered_prompt.substr(0, end), "<think>");
}

}  // namespace tessera::text
