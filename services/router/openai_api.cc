#include "services/router/openai_api.h"

#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/json.h"

namespace tessera::services {
namespace {

using nlohmann::json;
// Request bodies keep their keys in the client's order: tool schemas and
// call arguments reach the chat template (and so the model) as written.
using RequestJson = nlohmann::ordered_json;

constexpr int kMaxJsonDepth = 64;
constexpr int kMaxTopLogprobs = 20;

ApiError Invalid(const std::string& param, const std::string& message) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  return e;
}

// Nesting deeper than kMaxJsonDepth is refused before parsing (the parser
// and the value's destructor recurse).
bool TooDeep(const std::string& body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Reads the fields of one JSON object, by name, with type and range checks.
// Every field read (or explicitly ignored) is marked; Unknown() names the
// first that was not.
class Fields {
 public:
  Fields(const RequestJson& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  // The value, or nullptr when absent or null.
  const RequestJson* Get(const std::string& key) {
    seen_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void Ignore(const std::string& key) { seen_.insert(key); }
  std::string Name(const std::string& key) const { return prefix_ + key; }

  std::optional<ApiError> Bool(const std::string& key, std::optional<bool>* out) {
    const RequestJson* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return TypeError(key, "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }
  std::optional<ApiError> Int(const std::string& key, int64_t lo, int64_t hi,
                              std::optional<int64_t>* out) {
    const RequestJson* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) return TypeError(key, "an integer", *v);
    const int64_t x =
        v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? INT64_MAX : v->get<int64_t>();
    if (x < lo || x > hi) {
      return Invalid(Name(key),
                     absl::StrCat(Name(key), " must be in [", lo, ", ", hi, "], got ", v->dump()));
    }
    *out = x;
    return std::nullopt;
  }
  // lo_open: the range excludes lo.
  std::optional<ApiError> Number(const std::string& key, double lo, double hi, bool lo_open,
                                 std::optional<double>* out) {
    const RequestJson* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return TypeError(key, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      return Invalid(Name(key), absl::StrCat(Name(key), " must be in ", lo_open ? "(" : "[", lo,
                                             ", ", hi, "], got ", v->dump()));
    }
    *out = x;
    return std::nullopt;
  }
  std::optional<ApiError> String(const std::string& key, std::optional<std::string>* out) {
    const RequestJson* v = Get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return TypeError(key, "a string", *v);
    *out = v->get<std::string>();
    return std::nullopt;
  }

  std::optional<ApiError> TypeError(const std::string& key, const char* want,
                                    const RequestJson& v) {
    return Invalid(Name(key), absl::StrCat(Name(key), " must be ", want, ", got ",
                                           std::string(JsonTypeName(v))));
  }

  // The first field present that no one read: unsupported.
  std::optional<ApiError> Unknown() const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (seen_.count(it.key())) continue;
      return Invalid(Name(it.key()),
                     absl::StrCat("unsupported field '", Name(it.key()),
                                  "': this server does not implement it (and does not ignore it "
                                  "silently)"));
    }
    return std::nullopt;
  }

 private:
  const RequestJson& object_;
  const std::string prefix_;
  std::set<std::string> seen_;
};

#define RETURN_IF_API_ERROR(expr)        \
  do {                                   \
    if (auto _e = (expr); _e) return _e; \
  } while (0)

// Fields shared by both endpoints, into SamplingParams and ApiRequest.
std::optional<ApiError> ParseSampling(Fields& f, const OpenAiLimits& limits, bool chat,
                                      ApiRequest* out, tessera::v1::SamplingParams* s,
                                      bool* keep_special) {
  std::optional<double> d;
  std::optional<int64_t> i;
  std::optional<bool> b;
  RETURN_IF_API_ERROR(f.Number("temperature", 0, 2, false, &d));
  if (d) s->set_temperature(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(f.Number("top_p", 0, 1, true, &d));
  if (d) s->set_top_p(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(f.Int("top_k", -1, std::numeric_limits<int32_t>::max(), &i));
  if (i) s->set_top_k(static_cast<int32_t>(*i));
  i.reset();
  RETURN_IF_API_ERROR(f.Number("min_p", 0, 1, false, &d));
  if (d) s->set_min_p(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(f.Number("presence_penalty", -2, 2, false, &d));
  if (d) s->set_presence_penalty(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(f.Number("frequency_penalty", -2, 2, false, &d));
  if (d) s->set_frequency_penalty(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(f.Number("repetition_penalty", 0, 100, true, &d));
  if (d) s->set_repetition_penalty(static_cast<float>(*d));
  d.reset();
  RETURN_IF_API_ERROR(
      f.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &i));
  if (i) s->set_seed(static_cast<uint64_t>(*i));
  i.reset();
  // max_tokens (both endpoints) and max_completion_tokens (chat, newer).
  std::optional<int64_t> max_tokens, max_completion;
  RETURN_IF_API_ERROR(f.Int("max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens));
  if (chat) {
    RETURN_IF_API_ERROR(
        f.Int("max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &max_completion));
  }
  if (max_completion) {
    s->set_max_tokens(static_cast<int32_t>(*max_completion));
  } else if (max_tokens) {
    s->set_max_tokens(static_cast<int32_t>(*max_tokens));
  } else if (!chat) {
    s->set_max_tokens(16);  // OpenAI's documented default for completions
  }
  if (const RequestJson* stop = f.Get("stop")) {
    std::vector<std::string> stops;
    if (stop->is_string()) {
      stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const RequestJson& x : *stop) {
        if (!x.is_string()) return Invalid("stop", "stop must be a string or a list of strings");
        stops.push_back(x.get<std::string>());
      }
    } else {
      return f.TypeError("stop", "a string or a list of strings", *stop);
    }
    if (static_cast<int>(stops.size()) > limits.max_stop_strings) {
      return Invalid("stop", absl::StrCat("stop has ", stops.size(), " strings; at most ",
                                          limits.max_stop_strings));
    }
    for (const std::string& x : stops) {
      if (x.empty()) return Invalid("stop", "stop strings must not be empty");
      s->add_stop(x);
    }
  }
  RETURN_IF_API_ERROR(f.Bool("ignore_eos", &b));
  if (b) s->set_ignore_eos(*b);
  b.reset();
  RETURN_IF_API_ERROR(f.Bool("skip_special_tokens", &b));
  if (b) *keep_special = !*b;
  b.reset();
  // n
  RETURN_IF_API_ERROR(f.Int("n", 1, std::numeric_limits<int32_t>::max(), &i));
  out->n = i ? static_cast<int>(*i) : 1;
  if (out->n > limits.max_n) {
    return Invalid("n", absl::StrCat("n is ", out->n, "; this server allows at most ", limits.max_n,
                                     " choices per request"));
  }
  i.reset();
  // logprobs
  if (chat) {
    RETURN_IF_API_ERROR(f.Bool("logprobs", &b));
    out->logprobs = b.value_or(false);
    RETURN_IF_API_ERROR(f.Int("top_logprobs", 0, kMaxTopLogprobs, &i));
    if (i && !out->logprobs && *i > 0) {
      return Invalid("top_logprobs", "top_logprobs needs logprobs: true");
    }
    out->top_logprobs = i ? static_cast<int>(*i) : 0;
  } else {
    RETURN_IF_API_ERROR(f.Int("logprobs", 0, kMaxTopLogprobs, &i));
    out->logprobs = i.has_value();
    out->top_logprobs = i ? static_cast<int>(*i) : 0;
  }
  if (out->logprobs) {
    s->set_logprobs(true);
    if (out->top_logprobs > 0) s->set_top_logprobs(out->top_logprobs);
  }
  // stream
  b.reset();
  RETURN_IF_API_ERROR(f.Bool("stream", &b));
  out->stream = b.value_or(false);
  if (const RequestJson* so = f.Get("stream_options")) {
    if (!so->is_object()) return f.TypeError("stream_options", "an object", *so);
    Fields sf(*so, "stream_options.");
    std::optional<bool> usage;
    RETURN_IF_API_ERROR(sf.Bool("include_usage", &usage));
    sf.Ignore("continuous_usage_stats");  // vLLM's; usage comes at the end only
    RETURN_IF_API_ERROR(sf.Unknown());
    out->include_usage = usage.value_or(false);
  }
  // Refused with their names: features the router does not implement.
  if (const RequestJson* rf = f.Get("response_format")) {
    if (!rf->is_object() || rf->value("type", "") != "text") {
      return Invalid("response_format",
                     "response_format other than {\"type\": \"text\"} is not supported (no "
                     "constrained decoding: json_object and json_schema cannot be enforced)");
    }
  }
  if (const RequestJson* lb = f.Get("logit_bias")) {
    if (!lb->is_object() || !lb->empty()) {
      return Invalid("logit_bias", "logit_bias is not supported");
    }
  }
  // Harmless fields, ignored on purpose: the end user's id, and metadata
  // for the caller's own bookkeeping.
  f.Ignore("user");
  f.Ignore("metadata");
  if (const RequestJson* store = f.Get("store")) {
    if (!store->is_boolean() || store->get<bool>()) {
      return Invalid("store", "store: true is not supported (completions are not stored)");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseContent(const RequestJson& content, const std::string& where,
                                     std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) {
    return Invalid(where, absl::StrCat(where, " must be a string, a list of text parts or null"));
  }
  std::vector<std::string> texts;
  for (size_t k = 0; k < content.size(); ++k) {
    const RequestJson& part = content[k];
    const std::string pw = absl::StrCat(where, "[", k, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Invalid(pw, absl::StrCat(pw, " must be an object with a type"));
    }
    if (part["type"] != "text") {
      return Invalid(pw,
                     absl::StrCat(pw, ": content parts of type '", part["type"].get<std::string>(),
                                  "' are not supported (text only)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Invalid(pw, absl::StrCat(pw, ".text must be a string"));
    }
    texts.push_back(part["text"].get<std::string>());
  }
  *out = absl::StrJoin(texts, "\n");
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const RequestJson* messages, tessera::v1::ChatRequest* req) {
  if (messages == nullptr) return Invalid("messages", "messages is required");
  if (!messages->is_array()) {
    return Invalid("messages", absl::StrCat("messages must be a list, got ",
                                            std::string(JsonTypeName(*messages))));
  }
  if (messages->empty()) return Invalid("messages", "messages is empty: give at least one");
  for (size_t i = 0; i < messages->size(); ++i) {
    const RequestJson& m = (*messages)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, absl::StrCat(where, " must be an object"));
    Fields f(m, where + ".");
    tessera::v1::ChatMessage* out = req->add_messages();
    std::optional<std::string> role, name, tool_call_id, reasoning;
    RETURN_IF_API_ERROR(f.String("role", &role));
    if (!role) return Invalid(where + ".role", where + ".role is required");
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool" &&
        *role != "developer") {
      return Invalid(where + ".role", absl::StrCat(where, ".role '", role->substr(0, 32),
                                                   "' is not one of system, developer, user, "
                                                   "assistant, tool"));
    }
    out->set_role(*role);
    if (const RequestJson* c = f.Get("content")) {
      std::string text;
      RETURN_IF_API_ERROR(ParseContent(*c, where + ".content", &text));
      out->set_content(text);
    } else if (*role != "assistant") {
      return Invalid(where + ".content", where + ".content is required");
    }
    RETURN_IF_API_ERROR(f.String("name", &name));
    if (name) out->set_name(*name);
    RETURN_IF_API_ERROR(f.String("tool_call_id", &tool_call_id));
    if (tool_call_id) out->set_tool_call_id(*tool_call_id);
    if (*role == "tool" && !tool_call_id) {
      return Invalid(where + ".tool_call_id",
                     where + ".tool_call_id is required for a tool result");
    }
    RETURN_IF_API_ERROR(f.String("reasoning_content", &reasoning));
    if (reasoning) out->set_reasoning_content(*reasoning);
    if (const RequestJson* calls = f.Get("tool_calls")) {
      if (!calls->is_array()) return f.TypeError("tool_calls", "a list", *calls);
      for (size_t k = 0; k < calls->size(); ++k) {
        const RequestJson& c = (*calls)[k];
        const std::string cw = absl::StrCat(where, ".tool_calls[", k, "]");
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
          return Invalid(cw, absl::StrCat(cw, " must be an object with a function"));
        }
        const RequestJson& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string()) {
          return Invalid(cw + ".function.name", cw + ".function.name must be a string");
        }
        tessera::v1::ToolCallDelta* call = out->add_tool_calls();
        call->set_index(static_cast<int>(k));
        if (c.contains("id") && c["id"].is_string()) call->set_id(c["id"].get<std::string>());
        call->set_name(fn["name"].get<std::string>());
        if (fn.contains("arguments")) {
          if (fn["arguments"].is_string()) {
            call->set_arguments(fn["arguments"].get<std::string>());
          } else if (fn["arguments"].is_object()) {
            call->set_arguments(fn["arguments"].dump());
          } else {
            return Invalid(cw + ".function.arguments",
                           cw + ".function.arguments must be a JSON text");
          }
        }
      }
    }
    // What clients echo back from an earlier response; carries nothing the
    // template uses.
    f.Ignore("refusal");
    f.Ignore("annotations");
    RETURN_IF_API_ERROR(f.Unknown());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTools(Fields& f, tessera::v1::ChatRequest* req) {
  if (const RequestJson* tools = f.Get("tools")) {
    if (!tools->is_array()) return f.TypeError("tools", "a list", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const RequestJson& t = (*tools)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
          !t["function"].is_object()) {
        return Invalid(where, absl::StrCat(where,
                                           " must be {\"type\": \"function\", "
                                           "\"function\": {...}}"));
      }
      const RequestJson& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() ||
          fn["name"].get<std::string>().empty()) {
        return Invalid(where + ".function.name", where + ".function.name must be a string");
      }
      tessera::v1::ChatTool* out = req->add_tools();
      out->set_name(fn["name"].get<std::string>());
      if (fn.contains("description") && fn["description"].is_string()) {
        out->set_description(fn["description"].get<std::string>());
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null()) {
        if (!fn["parameters"].is_object()) {
          return Invalid(where + ".function.parameters",
                         where + ".function.parameters must be an object (a JSON Schema)");
        }
        out->set_parameters_json(fn["parameters"].dump());
      }
    }
  }
  if (const RequestJson* choice = f.Get("tool_choice")) {
    if (choice->is_string() && (*choice == "auto" || *choice == "none")) {
      req->set_tool_choice(choice->get<std::string>());
    } else {
      return Invalid("tool_choice",
                     absl::StrCat("tool_choice ", choice->dump().substr(0, 80),
                                  " is not supported: only \"auto\" and \"none\" (forcing a call "
                                  "needs constrained decoding, which this server does not do)"));
    }
  }
  if (const RequestJson* p = f.Get("parallel_tool_calls")) {
    if (!p->is_boolean() || !p->get<bool>()) {
      return Invalid("parallel_tool_calls",
                     "parallel_tool_calls: false is not supported (the model may make several "
                     "calls and none is dropped)");
    }
  }
  if (const RequestJson* kw = f.Get("chat_template_kwargs")) {
    if (!kw->is_object()) return f.TypeError("chat_template_kwargs", "an object", *kw);
    req->set_template_kwargs_json(kw->dump());
  }
  std::optional<bool> agp;
  RETURN_IF_API_ERROR(f.Bool("add_generation_prompt", &agp));
  if (agp) req->set_add_generation_prompt(*agp);
  return std::nullopt;
}

std::optional<ApiError> ParsePrompts(const RequestJson* prompt, const OpenAiLimits& limits,
                                     ApiRequest* out) {
  if (prompt == nullptr) return Invalid("prompt", "prompt is required");
  auto add_text = [&](const std::string& text) { out->prompts.emplace_back().set_text(text); };
  auto add_ids = [&](const RequestJson& ids) -> std::optional<ApiError> {
    tessera::v1::GenerateRequest& r = out->prompts.emplace_back();
    for (const RequestJson& t : ids) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Invalid("prompt", "a token-id prompt must hold non-negative integers");
      }
      r.mutable_token_ids()->add_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
    return std::nullopt;
  };
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    RETURN_IF_API_ERROR(add_ids(*prompt));
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const RequestJson& p : *prompt) {
      if (p.is_string()) {
        add_text(p.get<std::string>());
      } else if (p.is_array()) {
        RETURN_IF_API_ERROR(add_ids(p));
      } else {
        return Invalid("prompt",
                       "prompt must be a string, a list of strings, a list of token "
                       "ids or a list of such lists");
      }
    }
  } else {
    return Invalid("prompt",
                   "prompt must be a string, a list of strings, a list of token ids "
                   "or a list of such lists (and not empty)");
  }
  if (static_cast<int>(out->prompts.size()) > limits.max_prompts) {
    return Invalid("prompt", absl::StrCat("prompt holds ", out->prompts.size(),
                                          " prompts; at most ", limits.max_prompts));
  }
  return std::nullopt;
}

const char* FinishName(tessera::v1::FinishReason r) {
  switch (r) {
    case tessera::v1::FINISH_REASON_LENGTH:
      return "length";
    case tessera::v1::FINISH_REASON_CANCELLED:
      return "abort";  // the router's drain deadline cut the stream
    case tessera::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "stop";
  }
}

}  // namespace

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json({{"error", std::move(err)}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError ErrorFromStatus(const grpc::Status& status, const std::string& code) {
  ApiError e;
  e.message = status.error_message();
  e.code = code;
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      e.http_status = 400;
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      e.http_status = 401;
      e.type = "authentication_error";
      if (e.code.empty()) e.code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      e.type = "not_found_error";
      if (e.code.empty()) e.code = "model_not_found";
      e.param = "model";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      e.http_status = 429;
      e.type = "rate_limit_error";
      if (e.code.empty()) e.code = "rate_limit_exceeded";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case grpc::StatusCode::CANCELLED:
      e.http_status = 499;
      e.type = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  if (e.message.empty()) e.message = "request failed";
  return e;
}

std::optional<ApiError> ParseApiRequest(const std::string& body, bool chat,
                                        const OpenAiLimits& limits, ApiRequest* out) {
  if (TooDeep(body)) {
    return Invalid("", absl::StrCat("the JSON body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  absl::StatusOr<RequestJson> parsed = ParseOrderedJsonStrict(body);
  if (!parsed.ok()) {
    return Invalid("", absl::StrCat("the body is not valid JSON: ", parsed.status().message()));
  }
  const RequestJson& root = *parsed;
  if (!root.is_object()) {
    return Invalid(
        "", absl::StrCat("the body must be a JSON object, got ", std::string(JsonTypeName(root))));
  }
  out->chat = chat;
  Fields f(root, "");
  std::optional<std::string> model;
  RETURN_IF_API_ERROR(f.String("model", &model));
  out->model = model.value_or("");
  tessera::v1::SamplingParams sampling;
  bool keep_special = false;
  RETURN_IF_API_ERROR(ParseSampling(f, limits, chat, out, &sampling, &keep_special));
  if (chat) {
    tessera::v1::ChatRequest& req = out->chat_request;
    req.set_model(out->model);
    RETURN_IF_API_ERROR(ParseMessages(f.Get("messages"), &req));
    RETURN_IF_API_ERROR(ParseTools(f, &req));
    *req.mutable_sampling() = sampling;
    req.set_keep_special_tokens(keep_special);
  } else {
    RETURN_IF_API_ERROR(ParsePrompts(f.Get("prompt"), limits, out));
    std::optional<bool> echo;
    RETURN_IF_API_ERROR(f.Bool("echo", &echo));
    if (echo.value_or(false)) return Invalid("echo", "echo: true is not supported");
    std::optional<std::string> suffix;
    RETURN_IF_API_ERROR(f.String("suffix", &suffix));
    if (suffix && !suffix->empty()) return Invalid("suffix", "suffix is not supported");
    std::optional<int64_t> best_of;
    RETURN_IF_API_ERROR(f.Int("best_of", 1, 1 << 20, &best_of));
    if (best_of && *best_of != out->n) {
      return Invalid("best_of", "best_of other than n is not supported");
    }
    for (tessera::v1::GenerateRequest& r : out->prompts) {
      r.set_model(out->model);
      *r.mutable_sampling() = sampling;
      r.set_keep_special_tokens(keep_special);
    }
    if (out->choices() > limits.max_n) {
      return Invalid(
          "n", absl::StrCat("n times the prompts is ", out->choices(),
                            "; this server allows at most ", limits.max_n, " choices per request"));
    }
  }
  RETURN_IF_API_ERROR(f.Unknown());
  return std::nullopt;
}

std::string SseData(const std::string& json_text) {
  return absl::StrCat("data: ", json_text, "\n\n");
}

// --- responses ----------------------------------------------------------------

ResponseWriter::ResponseWriter(const ApiRequest& request, std::string id,
                               const Tokenizer* tokenizer)
    : request_(request),
      id_(std::move(id)),
      created_(absl::ToUnixSeconds(absl::Now())),
      tokenizer_(tokenizer),
      choices_(request.choices()),
      prompt_tokens_(request.chat ? 1 : request.prompts.size(), 0) {}

json ResponseWriter::Envelope() const {
  const bool chat = request_.chat;
  return {{"id", id_},
          {"object", chat ? (request_.stream ? "chat.completion.chunk" : "chat.completion")
                          : "text_completion"},
          {"created", created_},
          {"model", request_.model}};
}

json ResponseWriter::LogprobsFor(Choice& choice, const tessera::v1::Chunk& chunk) {
  auto token_text = [&](int32_t id) -> std::string {
    if (tokenizer_ == nullptr) return absl::StrCat("token_id:", id);
    DecodeOptions o;
    o.skip_special_tokens = false;
    auto t = tokenizer_->Decode(absl::MakeConstSpan(&id, 1), o);
    return t.ok() ? *t : absl::StrCat("token_id:", id);
  };
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  if (request_.chat) {
    json content = json::array();
    for (const tessera::v1::TokenLogprob& lp : chunk.logprobs()) {
      const std::string t = token_text(lp.token_id());
      json top = json::array();
      for (int k = 0; k < lp.top_token_ids_size() && k < request_.top_logprobs; ++k) {
        const std::string tt = token_text(lp.top_token_ids(k));
        top.push_back({{"token", tt},
                       {"logprob", k < lp.top_logprobs_size() ? lp.top_logprobs(k) : 0.0f},
                       {"bytes", bytes_of(tt)}});
      }
      content.push_back(
          {{"token", t}, {"logprob", lp.logprob()}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return content;
  }
  json lp = {{"tokens", json::array()},
             {"token_logprobs", json::array()},
             {"top_logprobs", json::array()},
             {"text_offset", json::array()}};
  for (const tessera::v1::TokenLogprob& p : chunk.logprobs()) {
    const std::string t = token_text(p.token_id());
    lp["tokens"].push_back(t);
    lp["token_logprobs"].push_back(p.logprob());
    json top = json::object();
    for (int k = 0; k < p.top_token_ids_size() && k < request_.top_logprobs; ++k) {
      top[token_text(p.top_token_ids(k))] = k < p.top_logprobs_size() ? p.top_logprobs(k) : 0.0f;
    }
    lp["top_logprobs"].push_back(std::move(top));
    lp["text_offset"].push_back(choice.text_offset);
    choice.text_offset += static_cast<int>(t.size());
  }
  return lp;
}

std::string ResponseWriter::FinishReason(const Choice& choice,
                                         const tessera::v1::Complete& complete) const {
  if (request_.chat && choice.saw_tool_call &&
      complete.finish_reason() == tessera::v1::FINISH_REASON_STOP) {
    return "tool_calls";
  }
  return FinishName(complete.finish_reason());
}

std::string ResponseWriter::ChunkEvent(int index, const tessera::v1::Chunk& chunk) {
  Choice& c = choices_[index];
  const bool has_logprobs = request_.logprobs && chunk.logprobs_size() > 0;
  json choice = {{"index", index}, {"finish_reason", nullptr}};
  if (request_.chat) {
    if (chunk.text().empty() && chunk.reasoning().empty() && chunk.tool_calls_size() == 0 &&
        !has_logprobs) {
      return "";
    }
    json delta = json::object();
    if (!c.role_sent) {
      delta["role"] = "assistant";
      c.role_sent = true;
    }
    if (!chunk.text().empty()) delta["content"] = chunk.text();
    if (!chunk.reasoning().empty()) delta["reasoning_content"] = chunk.reasoning();
    if (chunk.tool_calls_size() > 0) {
      json calls = json::array();
      for (const tessera::v1::ToolCallDelta& t : chunk.tool_calls()) {
        calls.push_back({{"index", t.index()},
                         {"id", t.id()},
                         {"type", "function"},
                         {"function", {{"name", t.name()}, {"arguments", t.arguments()}}}});
      }
      delta["tool_calls"] = std::move(calls);
      c.saw_tool_call = true;
    }
    choice["delta"] = std::move(delta);
    choice["logprobs"] = has_logprobs ? json({{"content", LogprobsFor(c, chunk)}}) : json(nullptr);
  } else {
    if (chunk.text().empty() && !has_logprobs) return "";
    choice["text"] = chunk.text();
    choice["logprobs"] = has_logprobs ? LogprobsFor(c, chunk) : json(nullptr);
  }
  json out = Envelope();
  out["choices"] = json::array({std::move(choice)});
  return SseData(out.dump(-1, ' ', false, json::error_handler_t::replace));
}

void ResponseWriter::AddUsage(const tessera::v1::Complete& complete, int index) {
  const int prompt_index = request_.chat ? 0 : index / request_.n;
  prompt_tokens_[prompt_index] = complete.usage().prompt_tokens();
  completion_tokens_ += complete.usage().completion_tokens();
  if (index % request_.n == 0) cached_tokens_ += complete.usage().cached_tokens();
}

json ResponseWriter::UsageJson() const {
  int prompt = 0;
  for (int p : prompt_tokens_) prompt += p;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

std::string ResponseWriter::FinishEvent(int index, const tessera::v1::Complete& complete) {
  Choice& c = choices_[index];
  AddUsage(complete, index);
  json choice = {{"index", index}, {"finish_reason", FinishReason(c, complete)}};
  if (request_.chat) {
    choice["delta"] = json::object();
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = "";
    choice["logprobs"] = nullptr;
  }
  json out = Envelope();
  out["choices"] = json::array({std::move(choice)});
  return SseData(out.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string ResponseWriter::EndEvents() {
  std::string out;
  if (request_.include_usage) {
    json u = Envelope();
    u["choices"] = json::array();
    u["usage"] = UsageJson();
    out = SseData(u.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ResponseWriter::ErrorEvent(const ApiError& error) {
  return SseData(ErrorJson(error)) + "data: [DONE]\n\n";
}

void ResponseWriter::Accumulate(int index, const tessera::v1::Chunk& chunk) {
  Choice& c = choices_[index];
  c.content += chunk.text();
  c.reasoning += chunk.reasoning();
  for (const tessera::v1::ToolCallDelta& t : chunk.tool_calls()) {
    c.tool_calls.push_back({{"id", t.id()},
                            {"type", "function"},
                            {"function", {{"name", t.name()}, {"arguments", t.arguments()}}}});
    c.saw_tool_call = true;
  }
  if (request_.logprobs && chunk.logprobs_size() > 0) {
    json lp = LogprobsFor(c, chunk);
    if (request_.chat) {
      if (c.logprobs.is_null()) c.logprobs = json::array();
      for (json& x : lp) c.logprobs.push_back(std::move(x));
    } else {
      if (c.logprobs.is_null()) {
        c.logprobs = std::move(lp);
      } else {
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          for (json& x : lp[k]) c.logprobs[k].push_back(std::move(x));
        }
      }
    }
  }
}

void ResponseWriter::AccumulateFinish(int index, const tessera::v1::Complete& complete) {
  AddUsage(complete, index);
  choices_[index].finish_reason = FinishReason(choices_[index], complete);
}

std::string ResponseWriter::ResponseBody() const {
  json out = Envelope();
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}, {"finish_reason", c.finish_reason}};
    if (request_.chat) {
      json message = {
          {"role", "assistant"},
          {"content", c.content.empty() && c.saw_tool_call ? json(nullptr) : json(c.content)}};
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      if (c.saw_tool_call) message["tool_calls"] = c.tool_calls;
      choice["message"] = std::move(message);
      choice["logprobs"] =
          request_.logprobs ? json({{"content", c.logprobs.is_null() ? json::array() : c.logprobs}})
                            : json(nullptr);
    } else {
      choice["text"] = c.content;
      choice["logprobs"] = request_.logprobs ? c.logprobs : json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  out["choices"] = std::move(choices);
  out["usage"] = UsageJson();
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tessera::services
