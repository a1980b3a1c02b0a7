// ChatRenderer: turns a tessera.v1.ChatRequest into the prompt text and the
// output-parser settings of one generation, with the served model's chat
// template (text/chat) and tool-call format (text/parsers).
//
// Messages and tools are given to the template in Hugging Face's JSON
// shapes (OpenAI's): {"role", "content", "tool_calls": [{"id", "type":
// "function", "function": {"name", "arguments"}}], "tool_call_id", "name",
// "reasoning_content"} and {"type": "function", "function": {"name",
// "description", "parameters"}}. A tool call's `arguments` text that is a
// JSON object is given as the object (templates such as Llama 3.1's
// serialize it with `tojson`), as vLLM does.
//
// Thread-safety: Render is const and may run on many threads at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/inference.pb.h"
#include "text/parsers/output_parser.h"

namespace tessera::text {
class ChatTemplate;  // text/chat/chat_template.h
}  // namespace tessera::text

namespace tessera::services {

enum class ReasoningMode { kAuto, kOn, kOff };

struct ChatOptions {
  // "auto" (from the template and config.json, see DefaultToolFormat) or one
  // of text::KnownToolFormats().
  std::string tool_call_parser = "auto";
  // kAuto: on when the chat template mentions "<think>".
  ReasoningMode reasoning = ReasoningMode::kAuto;
};

struct RenderedChat {
  std::string prompt;
  text::OutputParserOptions parser;
};

class ChatRenderer {
 public:
  // Loads the chat template of the model directory `dir` (its
  // tokenizer_config.json or chat_template.jinja, and config.json's
  // model_type). NOT_FOUND when it has no template; INVALID_ARGUMENT for a
  // template the interpreter refuses or an unknown --tool_call_parser.
  static absl::StatusOr<std::unique_ptr<ChatRenderer>> Load(const std::string& dir,
                                                            const ChatOptions& options);
  // For tests: a template given as text.
  static absl::StatusOr<std::unique_ptr<ChatRenderer>> FromSource(const std::string& source,
                                                                  const std::string& bos,
                                                                  const std::string& eos,
                                                                  const std::string& model_type,
                                                                  const ChatOptions& options);

  // INVALID_ARGUMENT for a request the template cannot take: no messages,
  // an unknown role, a tool whose parameters are not a JSON object,
  // template kwargs that are not a JSON object, a tool_choice other than
  // "auto" or "none", or an error the template raises.
  absl::StatusOr<RenderedChat> Render(const tessera::v1::ChatRequest& request) const;
  ~ChatRenderer();

  const std::string& tool_format() const { return tool_format_; }
  bool reasoning() const { return reasoning_; }

 private:
  ChatRenderer(std::unique_ptr<text::ChatTemplate> chat_template, std::string tool_format,
               bool reasoning);
  static absl::StatusOr<std::unique_ptr<ChatRenderer>> Make(
      std::unique_ptr<text::ChatTemplate> chat_template, const std::string& source,
      const std::string& model_type, const ChatOptions& options);

  std::unique_ptr<text::ChatTemplate> template_;
  std::string tool_format_;
  bool reasoning_;
};

}  // namespace tessera::services
