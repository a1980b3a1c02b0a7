#include "text/parsers/tool_call_json.h"

#include <nlohmann/json.hpp>

#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

using nlohmann::json;

std::optional<json> ParseObject(absl::string_view text) {
  text = TrimSpace(text);
  if (text.empty() || text.front() != '{') return std::nullopt;
  if (!JsonDepthWithin(text, kMaxJsonDepth)) return std::nullopt;
  json value = json::parse(text.begin(), text.end(), nullptr,
                           /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_object()) return std::nullopt;
  return value;
}

std::string Compact(const json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

}  // namespace

bool JsonDepthWithin(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escape = false;
  for (char c : text) {
    if (escape) {
      escape = false;
    } else if (in_string) {
      if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

std::optional<std::string> CompactJsonObject(absl::string_view text) {
  std::optional<json> value = ParseObject(text);
  if (!value) return std::nullopt;
  return Compact(*value);
}

std::optional<ParsedToolCall> ParseToolCallObject(absl::string_view text, bool require_arguments) {
  std::optional<json> value = ParseObject(text);
  if (!value) return std::nullopt;
  auto name = value->find("name");
  if (name == value->end() || !name->is_string()) return std::nullopt;
  ParsedToolCall call;
  call.name = name->get<std::string>();
  if (call.name.empty()) return std::nullopt;
  auto args = value->find("arguments");
  if (args == value->end()) args = value->find("parameters");
  if (args == value->end()) {
    if (require_arguments) return std::nullopt;
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = Compact(*args);
  } else if (args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_string() && TrimSpace(args->get_ref<const std::string&>()).empty()) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    std::optional<std::string> inner = CompactJsonObject(args->get_ref<const std::string&>());
    if (!inner) return std::nullopt;
    call.arguments = std::move(*inner);
  } else {
    return std::nullopt;
  }
  return call;
}

}  // namespace tessera::text
