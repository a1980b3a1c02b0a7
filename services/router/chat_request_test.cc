// From an OpenAI request body to the rendered prompt: the chat template must
// see tool schemas and call arguments in the key order the client sent, as
// transformers does (Python dicts keep insertion order). A router that sorted
// keys anywhere on the way (body parse, proto round trip, template input)
// would show the model a prompt it was not trained on.
#include "services/router/chat_request.h"

#include <string>

#include "gtest/gtest.h"
#include "services/router/openai_api.h"

namespace tessera::services {
namespace {

constexpr char kTemplate[] =
    "{{ tools[0].function | tojson }}|{{ messages[0].tool_calls[0].function.arguments | tojson "
    "}}|{{ style | tojson }}";

absl::StatusOr<std::string> RenderBody(const std::string& body) {
  ApiRequest request;
  if (auto error = ParseApiRequest(body, /*chat=*/true, OpenAiLimits(), &request)) {
    return absl::InvalidArgumentError(error->message);
  }
  auto renderer = ChatRenderer::FromSource(kTemplate, "", "", "", ChatOptions());
  if (!renderer.ok()) return renderer.status();
  auto rendered = (*renderer)->Render(request.chat_request);
  if (!rendered.ok()) return rendered.status();
  return rendered->prompt;
}

TEST(ChatRequestTest, KeysKeepTheClientsOrderFromBodyToPrompt) {
  const std::string function =
      R"({"name": "get_weather", "parameters": {"type": "object", "properties": )"
      R"({"zeta": {"type": "string"}, "alpha": {"type": "number"}}, "required": ["zeta"]}})";
  const std::string body = R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [)"
                           R"({"id": "c1", "type": "function", "function": {"name": "get_weather",)"
                           R"( "arguments": "{\"zeta\": \"Oslo\", \"alpha\": 2}"}}]}],)"
                           R"( "tools": [{"type": "function", "function": )" +
                           function + R"(}], "chat_template_kwargs": {"style": {"z": 1, "a": 2}}})";
  auto prompt = RenderBody(body);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, function + R"(|{"zeta": "Oslo", "alpha": 2}|{"z": 1, "a": 2})");
}

}  // namespace
}  // namespace tessera::services
