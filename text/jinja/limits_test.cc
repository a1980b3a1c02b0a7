// Hostile templates and inputs end in a clear error, quickly, never a hang,
// a crash or unbounded memory.
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/jinja/template.h"

namespace tessera::text::jinja {
namespace {

absl::Status RenderStatus(const std::string& source,
                          const nlohmann::json& vars = nlohmann::json::object(),
                          const RenderOptions& options = RenderOptions()) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(vars, options).status();
}

std::string Repeat(absl::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.append(s.data(), s.size());
  return out;
}

TEST(LimitsTest, DeepNestingIsRefusedAtLoad) {
  const std::string parens = "{{ " + Repeat("(", 5000) + "1" + Repeat(")", 5000) + " }}";
  auto t = Template::Parse(parens);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "nests deeper")) << t.status();

  const std::string ifs = Repeat("{% if true %}", 5000) + "x" + Repeat("{% endif %}", 5000);
  EXPECT_FALSE(Template::Parse(ifs).ok());

  const std::string lists = "{{ " + Repeat("[", 5000) + Repeat("]", 5000) + " }}";
  EXPECT_FALSE(Template::Parse(lists).ok());

  const std::string nots = "{{ " + Repeat("not ", 5000) + "x }}";
  EXPECT_FALSE(Template::Parse(nots).ok());

  // A long flat chain builds a deep tree without recursing in the parser.
  const std::string chain = "{{ 1" + Repeat(" + 1", 50000) + " }}";
  EXPECT_FALSE(Template::Parse(chain).ok());
  const std::string filters = "{{ 'x'" + Repeat(" | trim", 50000) + " }}";
  EXPECT_FALSE(Template::Parse(filters).ok());
  const std::string elifs = "{% if false %}" + Repeat("{% elif false %}", 50000) + "{% endif %}";
  EXPECT_FALSE(Template::Parse(elifs).ok());
}

TEST(LimitsTest, ModerateNestingStillWorks) {
  const std::string parens = "{{ " + Repeat("(", 50) + "1" + Repeat(")", 50) + " }}";
  EXPECT_TRUE(RenderStatus(parens).ok());
  const std::string chain = "{{ 1" + Repeat(" + 1", 150) + " }}";
  EXPECT_TRUE(RenderStatus(chain).ok());
}

TEST(LimitsTest, HugeLoopsStop) {
  // With the default limits: the step budget ends nested loops (about a
  // second of work), and range() refuses to build a huge list at all.
  const absl::Time start = absl::Now();
  absl::Status s = RenderStatus(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "steps")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));

  s = RenderStatus("{% for i in range(100000000) %}{% endfor %}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  s = RenderStatus("{{ range(10) + range(99995) }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(LimitsTest, StepBudgetIsConfigurable) {
  RenderOptions options;
  options.limits.max_steps = 1000;
  absl::Status s = RenderStatus("{% for i in range(5000) %}{{ i }}{% endfor %}",
                                nlohmann::json::object(), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "steps")) << s;
}

TEST(LimitsTest, OutputAndStringGrowthStop) {
  RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  absl::Status s = RenderStatus(
      "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(100) %}"
      "{% set ns.s = ns.s + ns.s %}{% endfor %}",
      nlohmann::json::object(), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  s = RenderStatus("{% for i in range(90000) %}{{ 'some text, some more text' }}{% endfor %}",
                   nlohmann::json::object(), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;

  s = RenderStatus("{{ ('x' * 1) }}", nlohmann::json::object(), options);
  EXPECT_FALSE(s.ok());  // string * number is not an operation

  s = RenderStatus("{{ s | replace('', s) }}", {{"s", std::string(4096, 'a')}}, options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(LimitsTest, RecursiveMacrosStop) {
  absl::Status s = RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "macro calls nest")) << s;
}

TEST(LimitsTest, SelfContainingNamespaceCannotPrintForever) {
  absl::Status s = RenderStatus("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns | tojson }}");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "contains itself")) << s;
}

TEST(LimitsTest, DeepInputIsRefused) {
  nlohmann::json deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  absl::Status s = RenderStatus("{{ x }}", {{"x", deep}});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "nests deeper")) << s;
}

TEST(LimitsTest, CallerCannotOutliveItsBlock) {
  absl::Status s = RenderStatus(
      "{% set ns = namespace(c=none) %}"
      "{% macro keep() %}{% set ns.c = caller %}{% endmacro %}"
      "{% call keep() %}body{% endcall %}{{ ns.c() }}");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "after its call block")) << s;
}

TEST(LimitsTest, MalformedUtf8DoesNotCrash) {
  const std::string bad = "\xff\xfe{{ '\xc3' }}\xe2\x82";
  auto t = Template::Parse(bad);
  if (t.ok()) (void)(*t)->Render(nlohmann::json::object());
  SUCCEED();
}

}  // namespace
}  // namespace tessera::text::jinja
