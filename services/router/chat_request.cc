#include "services/router/chat_request.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/json.h"
#include "nlohmann/json.hpp"
#include "text/chat/chat_template.h"

namespace tessera::services {
namespace {

using nlohmann::json;
// What the template is given keeps the client's key order (transformers keeps
// Python's dict order): a tool's schema reaches the model as it was written.
using OrderedJson = nlohmann::ordered_json;

constexpr uint64_t kMaxConfigBytes = 16 << 20;

// The template text as the directory gives it (for choosing the tool-call
// format and the reasoning default); "" when there is none.
std::string TemplateSource(const std::string& dir) {
  if (auto jinja = ReadFileBounded(dir + "/chat_template.jinja", kMaxConfigBytes); jinja.ok()) {
    return *jinja;
  }
  auto config = ReadJsonFile(dir + "/tokenizer_config.json", kMaxConfigBytes);
  if (!config.ok() || !config->is_object()) return "";
  auto it = config->find("chat_template");
  if (it == config->end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {  // [{"name": "default", "template": ...}, ...]
    for (const json& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        return t["template"].get<std::string>();
      }
    }
  }
  return "";
}

std::string ModelType(const std::string& dir) {
  auto config = ReadJsonFile(dir + "/config.json", kMaxConfigBytes);
  if (!config.ok() || !config->is_object()) return "";
  auto it = config->find("model_type");
  return it != config->end() && it->is_string() ? it->get<std::string>() : "";
}

// A JSON value given as text; `what` names it in errors.
absl::StatusOr<OrderedJson> ParseJsonText(const std::string& text, const std::string& what) {
  OrderedJson v = OrderedJson::parse(text, nullptr, false);
  if (v.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  return v;
}

absl::StatusOr<OrderedJson> MessagesJson(const tessera::v1::ChatRequest& req) {
  if (req.messages().empty()) {
    return absl::InvalidArgumentError("messages is empty: give at least one message");
  }
  OrderedJson out = OrderedJson::array();
  for (int i = 0; i < req.messages_size(); ++i) {
    const tessera::v1::ChatMessage& m = req.messages(i);
    const std::string where = absl::StrCat("messages[", i, "]");
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
        m.role() != "tool" && m.role() != "developer") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".role must be system, user, assistant, tool or developer"));
    }
    OrderedJson msg = OrderedJson::object();
    msg["role"] = m.role();
    msg["content"] = m.has_content() ? OrderedJson(m.content()) : OrderedJson(nullptr);
    if (m.tool_calls_size() > 0) {
      if (m.role() != "assistant") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".tool_calls is only for assistant messages"));
      }
      OrderedJson calls = OrderedJson::array();
      for (const tessera::v1::ToolCallDelta& c : m.tool_calls()) {
        OrderedJson args = OrderedJson::parse(c.arguments(), nullptr, false);
        OrderedJson call = {
            {"type", "function"},
            {"function",
             {{"name", c.name()},
              {"arguments",
               !args.is_discarded() && args.is_object() ? args : OrderedJson(c.arguments())}}}};
        if (!c.id().empty()) call["id"] = c.id();
        calls.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) msg["tool_call_id"] = m.tool_call_id();
    if (!m.name().empty()) msg["name"] = m.name();
    if (m.has_reasoning_content()) msg["reasoning_content"] = m.reasoning_content();
    out.push_back(std::move(msg));
  }
  return out;
}

absl::StatusOr<OrderedJson> ToolsJson(const tessera::v1::ChatRequest& req) {
  OrderedJson out = OrderedJson::array();
  for (int i = 0; i < req.tools_size(); ++i) {
    const tessera::v1::ChatTool& t = req.tools(i);
    const std::string where = absl::StrCat("tools[", i, "]");
    if (t.name().empty()) return absl::InvalidArgumentError(absl::StrCat(where, ".name is empty"));
    OrderedJson fn = {{"name", t.name()}};
    if (!t.description().empty()) fn["description"] = t.description();
    if (!t.parameters_json().empty()) {
      auto params = ParseJsonText(t.parameters_json(), where + ".parameters");
      if (!params.ok()) return params.status();
      if (!params->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".parameters must be a JSON object"));
      }
      fn["parameters"] = std::move(*params);
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

ChatRenderer::ChatRenderer(std::unique_ptr<text::ChatTemplate> chat_template,
                           std::string tool_format, bool reasoning)
    : template_(std::move(chat_template)),
      tool_format_(std::move(tool_format)),
      reasoning_(reasoning) {}

ChatRenderer::~ChatRenderer() = default;

absl::StatusOr<std::unique_ptr<ChatRenderer>> ChatRenderer::Make(
    std::unique_ptr<text::ChatTemplate> chat_template, const std::string& source,
    const std::string& model_type, const ChatOptions& options) {
  std::string format = options.tool_call_parser;
  if (format.empty() || format == "auto") {
    format = text::DefaultToolFormat(model_type, source);
  } else {
    const auto& known = text::KnownToolFormats();
    if (std::find(known.begin(), known.end(), format) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--tool_call_parser=", format,
                                                     " is not known; known: auto, ",
                                                     absl::StrJoin(known, ", ")));
    }
  }
  bool reasoning =
      options.reasoning == ReasoningMode::kOn ||
      (options.reasoning == ReasoningMode::kAuto && absl::StrContains(source, "<think>"));
  return std::unique_ptr<ChatRenderer>(
      new ChatRenderer(std::move(chat_template), std::move(format), reasoning));
}

absl::StatusOr<std::unique_ptr<ChatRenderer>> ChatRenderer::Load(const std::string& dir,
                                                                 const ChatOptions& options) {
  auto t = text::ChatTemplate::FromModelDir(dir);
  if (!t.ok()) return t.status();
  return Make(std::move(*t), TemplateSource(dir), ModelType(dir), options);
}

absl::StatusOr<std::unique_ptr<ChatRenderer>> ChatRenderer::FromSource(
    const std::string& source, const std::string& bos, const std::string& eos,
    const std::string& model_type, const ChatOptions& options) {
  auto t = text::ChatTemplate::FromSource(source, bos, eos);
  if (!t.ok()) return t.status();
  return Make(std::move(*t), source, model_type, options);
}

absl::StatusOr<RenderedChat> ChatRenderer::Render(const tessera::v1::ChatRequest& req) const {
  const std::string& choice = req.tool_choice();
  if (!choice.empty() && choice != "auto" && choice != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tool_choice '", choice.substr(0, 64),
        "' is not supported: only \"auto\" and \"none\" (forcing a call needs constrained "
        "decoding, which this router does not do)"));
  }
  const bool tools_on = choice != "none" && req.tools_size() > 0;
  text::ChatRenderInput input;
  auto messages = MessagesJson(req);
  if (!messages.ok()) return messages.status();
  input.messages = std::move(*messages);
  if (tools_on) {  // else null: templates test `tools is defined` / `if tools`
    auto tools = ToolsJson(req);
    if (!tools.ok()) return tools.status();
    input.tools = std::move(*tools);
  }
  input.add_generation_prompt =
      req.has_add_generation_prompt() ? req.add_generation_prompt() : true;
  input.kwargs = OrderedJson::object();
  if (!req.template_kwargs_json().empty()) {
    auto kwargs = ParseJsonText(req.template_kwargs_json(), "chat_template_kwargs");
    if (!kwargs.ok()) return kwargs.status();
    if (!kwargs->is_object()) {
      return absl::InvalidArgumentError("chat_template_kwargs must be a JSON object");
    }
    for (const char* reserved : {"messages", "tools", "add_generation_prompt"}) {
      if (kwargs->contains(reserved)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chat_template_kwargs may not set '", reserved, "': it is a field of the request"));
      }
    }
    input.kwargs = std::move(*kwargs);
  }
  auto prompt = template_->Render(input);
  if (!prompt.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the chat template could not render these messages: ", prompt.status().message()));
  }
  RenderedChat out;
  out.prompt = std::move(*prompt);
  out.parser.tool_format = tools_on ? tool_format_ : "none";
  out.parser.reasoning = reasoning_;
  out.parser.starts_in_reasoning = reasoning_ && text::PromptOpensReasoning(out.prompt);
  if (req.sampling().has_seed()) out.parser.id_seed = req.sampling().seed() ^ 0x7e55e4a;
  return out;
}

}  // namespace tessera::services
