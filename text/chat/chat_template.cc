#include "text/chat/chat_template.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tessera::text {
namespace {

// tokenizer_config.json files that embed large vocabularies run to a few
// MiB; anything past this is not a config file.
constexpr std::streamoff kMaxConfigBytes = 64 << 20;

// Reads a whole file of at most kMaxConfigBytes. NotFound when missing.
absl::StatusOr<std::string> ReadBounded(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " does not exist or cannot be read"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  if (size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is larger than ", kMaxConfigBytes, " bytes"));
  }
  in.seekg(0, std::ios::beg);
  std::string data(static_cast<size_t>(size), '\0');
  in.read(data.data(), size);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return data;
}

// bos_token / eos_token: a string, {"content": string}, or absent/null.
absl::StatusOr<std::string> SpecialToken(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer_config.json: ", key, " must be a string or {\"content\": string}"));
}

absl::StatusOr<std::unique_ptr<jinja::Template>> ParseTemplate(absl::string_view source,
                                                               absl::string_view where) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("chat template ", where, ": ", t.status().message()));
  }
  return t;
}

absl::Status ValidateInput(const ChatRenderInput& input) {
  if (!input.messages.is_array()) return absl::InvalidArgumentError("messages must be an array");
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const nlohmann::ordered_json& m = input.messages[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "] must be an object"));
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role must be a string"));
    }
    auto calls = m.find("tool_calls");
    if (calls != m.end() && !calls->is_null() && !calls->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].tool_calls must be an array"));
    }
  }
  if (!input.tools.is_null() && !input.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be null or an array");
  }
  if (!input.kwargs.is_object()) {
    return absl::InvalidArgumentError("chat template kwargs must be an object");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(absl::string_view dir) {
  const std::string base(dir);
  nlohmann::json config = nlohmann::json::object();
  const std::string config_path = absl::StrCat(base, "/tokenizer_config.json");
  auto config_text = ReadBounded(config_path);
  if (config_text.ok()) {
    config = nlohmann::json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, " is not a JSON object"));
    }
  } else if (!absl::IsNotFound(config_text.status())) {
    return config_text.status();
  }
  ASSIGN_OR_RETURN(std::string bos, SpecialToken(config, "bos_token"));
  ASSIGN_OR_RETURN(std::string eos, SpecialToken(config, "eos_token"));

  const std::string jinja_path = absl::StrCat(base, "/chat_template.jinja");
  auto jinja_text = ReadBounded(jinja_path);
  if (jinja_text.ok()) {
    ASSIGN_OR_RETURN(auto t, ParseTemplate(*jinja_text, jinja_path));
    return std::unique_ptr<ChatTemplate>(
        new ChatTemplate(std::move(t), nullptr, std::move(bos), std::move(eos)));
  }
  if (!absl::IsNotFound(jinja_text.status())) return jinja_text.status();

  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat("no chat template in ", base,
                                            " (neither chat_template.jinja nor a "
                                            "\"chat_template\" in tokenizer_config.json)"));
  }
  if (it->is_string()) {
    ASSIGN_OR_RETURN(auto t, ParseTemplate(it->get<std::string>(), config_path));
    return std::unique_ptr<ChatTemplate>(
        new ChatTemplate(std::move(t), nullptr, std::move(bos), std::move(eos)));
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": chat_template must be a string or a list of {name, template}"));
  }
  std::unique_ptr<jinja::Template> default_template;
  std::unique_ptr<jinja::Template> tool_use;
  for (const nlohmann::json& entry : *it) {
    auto name = entry.is_object() ? entry.find("name") : entry.end();
    auto source = entry.is_object() ? entry.find("template") : entry.end();
    if (!entry.is_object() || name == entry.end() || !name->is_string() || source == entry.end() ||
        !source->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_path,
          ": each chat_template entry must be {\"name\": string, \"template\": string}"));
    }
    const std::string n = name->get<std::string>();
    if (n != "default" && n != "tool_use") continue;
    ASSIGN_OR_RETURN(
        auto t, ParseTemplate(source->get<std::string>(), absl::StrCat(config_path, " (", n, ")")));
    (n == "default" ? default_template : tool_use) = std::move(t);
  }
  if (default_template == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": chat_template lists no template named \"default\""));
  }
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(
      std::move(default_template), std::move(tool_use), std::move(bos), std::move(eos)));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromSource(absl::string_view source,
                                                                       std::string bos_token,
                                                                       std::string eos_token) {
  ASSIGN_OR_RETURN(auto t, ParseTemplate(source, "source"));
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(std::move(t), nullptr, std::move(bos_token), std::move(eos_token)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatRenderInput& input) const {
  RETURN_IF_ERROR(ValidateInput(input));
  const jinja::RenderOptions options;
  const int max_depth = options.limits.max_input_depth;
  jinja::ValueMap vars;
  ASSIGN_OR_RETURN(jinja::Value messages, jinja::ValueFromJson(input.messages, max_depth));
  vars.Set("messages", std::move(messages));
  if (!input.tools.is_null()) {
    ASSIGN_OR_RETURN(jinja::Value tools, jinja::ValueFromJson(input.tools, max_depth));
    vars.Set("tools", std::move(tools));
  }
  vars.Set("add_generation_prompt", jinja::Value::Bool(input.add_generation_prompt));
  vars.Set("bos_token", jinja::Value::String(bos_token_));
  vars.Set("eos_token", jinja::Value::String(eos_token_));
  for (auto it = input.kwargs.begin(); it != input.kwargs.end(); ++it) {
    if (vars.Find(it.key()) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template kwarg '", it.key(), "' would replace a variable the template is given"));
    }
    ASSIGN_OR_RETURN(jinja::Value v, jinja::ValueFromJson(it.value(), max_depth));
    vars.Set(it.key(), std::move(v));
  }
  const jinja::Template& t =
      (!input.tools.is_null() && tool_use_ != nullptr) ? *tool_use_ : *default_;
  return t.Render(vars, options);
}

}  // namespace tessera::text
