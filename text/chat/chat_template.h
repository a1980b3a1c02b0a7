// A model's chat template: turns chat messages and tools into the prompt
// text the model was trained on, by rendering the Hugging Face template
// (chat_template.jinja or tokenizer_config.json's "chat_template") with the
// Jinja interpreter of text/jinja.
//
// The template sees the variables transformers gives it: `messages`,
// `tools` (only when given), `add_generation_prompt`, `bos_token`,
// `eos_token`, plus the request's template kwargs (e.g. enable_thinking).
// Messages and tools are passed exactly as they arrive (HF shapes); a tool
// call's `function.arguments` may be an object or a JSON string, as in
// transformers. Objects keep their keys in the order they were given
// (nlohmann::ordered_json), as transformers' Python dicts do: a template that
// prints a mapping (`tools | tojson`) shows a tool schema to the model in the
// order the client wrote it.
//
// Thread-safety: immutable after construction; Render is const and safe to
// call from many threads at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "text/jinja/template.h"

namespace tessera::text {

struct ChatRenderInput {
  // HF shapes: {role, content (string or null or list of {type:"text",text}),
  // tool_calls?: [{id?, type:"function", function:{name, arguments (object
  // or JSON string)}}], tool_call_id?, name?, reasoning_content?}
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // null or array of {type:"function", function:{name, description, parameters}}
  nlohmann::ordered_json tools = nullptr;
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra template variables
};

class ChatTemplate {
 public:
  // chat_template.jinja in `dir` if present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {name, template}: "default",
  // and "tool_use" when tools are given and it exists). bos_token/eos_token
  // from tokenizer_config.json (a string or {"content": ...}). A missing or
  // unparsable template is a clear error.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(absl::string_view dir);
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromSource(absl::string_view source,
                                                                  std::string bos_token,
                                                                  std::string eos_token);

  // Thread-safe (const; many requests render concurrently). Bad input shapes,
  // the template's own raise_exception and anything the interpreter does not
  // support are InvalidArgument/Unimplemented errors; exceeding the render
  // limits is ResourceExhausted.
  absl::StatusOr<std::string> Render(const ChatRenderInput& input) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool has_tool_use_template() const { return tool_use_ != nullptr; }

 private:
  ChatTemplate(std::unique_ptr<jinja::Template> default_template,
               std::unique_ptr<jinja::Template> tool_use, std::string bos, std::string eos)
      : default_(std::move(default_template)),
        tool_use_(std::move(tool_use)),
        bos_token_(std::move(bos)),
        eos_token_(std::move(eos)) {}

  std::unique_ptr<jinja::Template> default_;
  std::unique_ptr<jinja::Template> tool_use_;  // may be null
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace tessera::text
