// ChatTemplate: loading from a model directory, the variables a template
// sees, and input validation.
#include "text/chat/chat_template.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera::text {
namespace {

class ModelDir {
 public:
  explicit ModelDir(absl::string_view name)
      : path_(absl::StrCat(testing::TempDir(), "/chat_template_test_", name)) {
    mkdir(path_.c_str(), 0700);
    std::remove(absl::StrCat(path_, "/chat_template.jinja").c_str());
    std::remove(absl::StrCat(path_, "/tokenizer_config.json").c_str());
  }
  void Write(absl::string_view file, absl::string_view text) const {
    std::ofstream out(absl::StrCat(path_, "/", file), std::ios::binary);
    out << text;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

ChatRenderInput UserSays(absl::string_view text) {
  ChatRenderInput in;
  in.messages = nlohmann::json::array({{{"role", "user"}, {"content", std::string(text)}}});
  return in;
}

TEST(ChatTemplateTest, FromSourceExposesTheTransformersVariables) {
  auto t = ChatTemplate::FromSource(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
      "{% if tools is defined %}tools={{ tools | length }}{% endif %}"
      "{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}"
      "{% if enable_thinking is defined %} think={{ enable_thinking }}{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderInput in = UserSays("hi");
  auto r = (*t)->Render(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "<s>[user:hi]<gen></s>");

  in.add_generation_prompt = false;
  in.tools = nlohmann::json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  in.kwargs = {{"enable_thinking", false}};
  r = (*t)->Render(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "<s>[user:hi]tools=1</s> think=false");
}

TEST(ChatTemplateTest, ToolCallArgumentsPassAsGiven) {
  auto t = ChatTemplate::FromSource(
      "{% for c in messages[0].tool_calls %}{% if c.function.arguments is string %}"
      "S{{ c.function.arguments }}{% else %}O{{ c.function.arguments | tojson }}{% endif %};"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRenderInput in;
  in.messages = nlohmann::json::parse(R"([{"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
      {"type": "function", "function": {"name": "g", "arguments": {"b": [1, "x"]}}}]}])");
  auto r = (*t)->Render(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "S{\"a\": 1};O{\"b\": [1, \"x\"]};");
}

// transformers renders tool schemas in the order the client wrote them
// (Python dicts keep insertion order), so a schema whose keys are not sorted
// must print unsorted; sorted output would show the model a different prompt.
TEST(ChatTemplateTest, ToolSchemaAndArgumentsKeepTheirKeyOrder) {
  auto t = ChatTemplate::FromSource(
      "{{ tools[0] | tojson }}|{% for k in tools[0].function.parameters.properties %}{{ k }},"
      "{% endfor %}|{{ messages[0].tool_calls[0].function.arguments | tojson }}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string tool =
      R"({"type": "function", "function": {"name": "get_weather", "parameters": )"
      R"({"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": )"
      R"({"type": "number"}}, "required": ["zeta"]}, "description": "weather"}})";
  ChatRenderInput in;
  in.tools = nlohmann::ordered_json::array({nlohmann::ordered_json::parse(tool)});
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "assistant", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather",
       "arguments": {"zeta": "Oslo", "alpha": 2}}}]}])");
  auto r = (*t)->Render(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, tool + R"(|zeta,alpha,|{"zeta": "Oslo", "alpha": 2})");
}

TEST(ChatTemplateTest, FromModelDirPrefersChatTemplateJinja) {
  ModelDir dir("jinja_file");
  dir.Write("chat_template.jinja", "file:{{ messages[0].content }}\n");
  dir.Write("tokenizer_config.json",
            R"({"chat_template": "config", "bos_token": {"content": "<bos>", "lstrip": false},
                "eos_token": "<eos>"})");
  auto t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_token(), "<bos>");
  EXPECT_EQ((*t)->eos_token(), "<eos>");
  auto r = (*t)->Render(UserSays("x"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "file:x");
}

TEST(ChatTemplateTest, FromModelDirReadsTheConfigTemplate) {
  ModelDir dir("config_string");
  dir.Write("tokenizer_config.json",
            R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos_token": null})");
  auto t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  auto r = (*t)->Render(UserSays("plain"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "plain");
}

TEST(ChatTemplateTest, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  ModelDir dir("named");
  dir.Write("tokenizer_config.json", R"({"chat_template": [
      {"name": "default", "template": "default"},
      {"name": "rag", "template": "{% include 'x' %}"},
      {"name": "tool_use", "template": "tool_use:{{ tools | length }}"}]})");
  auto t = ChatTemplate::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->has_tool_use_template());
  ChatRenderInput in = UserSays("x");
  EXPECT_EQ(*(*t)->Render(in), "default");
  in.tools = nlohmann::json::array({{{"type", "function"}}});
  EXPECT_EQ(*(*t)->Render(in), "tool_use:1");
}

TEST(ChatTemplateTest, LoadErrorsAreClear) {
  ModelDir none("none");
  auto t = ChatTemplate::FromModelDir(none.path());
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "no chat template")) << t.status();

  ModelDir bad_json("bad_json");
  bad_json.Write("tokenizer_config.json", "{not json");
  EXPECT_FALSE(ChatTemplate::FromModelDir(bad_json.path()).ok());

  ModelDir bad_template("bad_template");
  bad_template.Write("tokenizer_config.json", R"({"chat_template": "{% for x in %}"})");
  t = ChatTemplate::FromModelDir(bad_template.path());
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "line 1, column")) << t.status();

  ModelDir no_default("no_default");
  no_default.Write("tokenizer_config.json",
                   R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_FALSE(ChatTemplate::FromModelDir(no_default.path()).ok());

  ModelDir bad_bos("bad_bos");
  bad_bos.Write("tokenizer_config.json", R"({"chat_template": "x", "bos_token": 7})");
  EXPECT_FALSE(ChatTemplate::FromModelDir(bad_bos.path()).ok());

  EXPECT_FALSE(ChatTemplate::FromSource("{% macro %}", "", "").ok());
}

TEST(ChatTemplateTest, BadInputShapesAreRejected) {
  auto t = ChatTemplate::FromSource("{{ messages | length }}", "", "");
  ASSERT_TRUE(t.ok());
  ChatRenderInput in;
  in.messages = nlohmann::json::object();
  EXPECT_FALSE((*t)->Render(in).ok());
  in.messages = nlohmann::json::array({"not an object"});
  EXPECT_FALSE((*t)->Render(in).ok());
  in.messages = nlohmann::json::array({{{"content", "no role"}}});
  auto r = (*t)->Render(in);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "messages[0].role")) << r.status();
  in.messages = nlohmann::json::array({{{"role", 3}}});
  EXPECT_FALSE((*t)->Render(in).ok());
  in = UserSays("x");
  in.tools = "not a list";
  EXPECT_FALSE((*t)->Render(in).ok());
  in = UserSays("x");
  in.kwargs = nlohmann::json::array();
  EXPECT_FALSE((*t)->Render(in).ok());
  in = UserSays("x");
  in.kwargs = {{"messages", nlohmann::json::array()}};
  EXPECT_FALSE((*t)->Render(in).ok());
  in = UserSays("x");
  in.messages[0]["tool_calls"] = "not a list";
  EXPECT_FALSE((*t)->Render(in).ok());
  // An empty conversation is the template's business.
  in = ChatRenderInput();
  EXPECT_EQ(*(*t)->Render(in), "0");
}

TEST(ChatTemplateTest, TemplateErrorsSurface) {
  auto t = ChatTemplate::FromSource(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
      "", "");
  ASSERT_TRUE(t.ok());
  ChatRenderInput in;
  in.messages = nlohmann::json::array({{{"role", "assistant"}, {"content", "x"}}});
  auto r = (*t)->Render(in);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "first must be user")) << r.status();
}

}  // namespace
}  // namespace tessera::text
