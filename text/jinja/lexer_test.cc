// Tokenizer tests: whitespace control, trim_blocks/lstrip_blocks, literals,
// positions.
#include "text/jinja/lexer.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace tessera::text::jinja {
namespace {

std::vector<std::string> Describe(absl::string_view source, LexOptions options = LexOptions()) {
  auto tokens = Tokenize(source, options);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  std::vector<std::string> out;
  if (!tokens.ok()) return out;
  for (const Token& t : *tokens) {
    out.push_back(std::string(TokenTypeName(t.type)) + ":" + t.value);
  }
  return out;
}

TEST(LexerTest, TextAndTags) {
  EXPECT_EQ(Describe("a{{ x }}b"),
            (std::vector<std::string>{"Text:a", "OpenExpression:{{", "Identifier:x",
                                      "CloseExpression:}}", "Text:b"}));
  EXPECT_EQ(Describe("{% if a.b[0] %}"),
            (std::vector<std::string>{"OpenStatement:{%", "Identifier:if", "Identifier:a", "Dot:.",
                                      "Identifier:b", "OpenSquareBracket:[", "NumericLiteral:0",
                                      "CloseSquareBracket:]", "CloseStatement:%}"}));
}

TEST(LexerTest, DashStripsWhitespaceIncludingUnicode) {
  EXPECT_EQ(Describe("a \n\t{{- x -}}\u3000 b"),
            (std::vector<std::string>{"Text:a", "OpenExpression:{{", "Identifier:x",
                                      "CloseExpression:}}", "Text:b"}));
}

TEST(LexerTest, TrimAndLstripBlocks) {
  // The newline after a block tag goes; spaces before a block tag on its line go.
  EXPECT_EQ(Describe("  {% if x %}\nA\n  {% endif %}\nB"),
            (std::vector<std::string>{"OpenStatement:{%", "Identifier:if", "Identifier:x",
                                      "CloseStatement:%}", "Text:A\n", "OpenStatement:{%",
                                      "Identifier:endif", "CloseStatement:%}", "Text:B"}));
  // Expressions keep their newline.
  EXPECT_EQ(Describe("{{ x }}\nA"),
            (std::vector<std::string>{"OpenExpression:{{", "Identifier:x", "CloseExpression:}}",
                                      "Text:\nA"}));
  // Without the options everything stays.
  LexOptions raw;
  raw.trim_blocks = false;
  raw.lstrip_blocks = false;
  EXPECT_EQ(Describe("  {% x %}\nA", raw),
            (std::vector<std::string>{"Text:  ", "OpenStatement:{%", "Identifier:x",
                                      "CloseStatement:%}", "Text:\nA"}));
}

TEST(LexerTest, NumbersAndUnaryMinus) {
  EXPECT_EQ(Describe("{{ -1 + x - 2.5 }}"),
            (std::vector<std::string>{"OpenExpression:{{", "NumericLiteral:-1",
                                      "AdditiveBinaryOperator:+", "Identifier:x",
                                      "AdditiveBinaryOperator:-", "NumericLiteral:2.5",
                                      "CloseExpression:}}"}));
  EXPECT_EQ(Describe("{{ a[-1] }}")[3], "NumericLiteral:-1");
  EXPECT_EQ(Describe("{{ (-x) }}")[2], "UnaryOperator:-");
}

TEST(LexerTest, StringEscapes) {
  auto d = Describe(R"({{ 'a\nb\t\'c\u00e9\x41\ud83d\ude00' }})");
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[1], "StringLiteral:a\nb\t'c\xc3\xa9" "A\xf0\x9f\x98\x80");
}

TEST(LexerTest, ErrorsNamePositions) {
  for (const char* bad : {"ok\n{{ 'open", "{{ x @ y }}", "{# no end", R"({{ '\q' }})",
                          R"({{ '\ud800' }})", "{{ é }}"}) {
    SCOPED_TRACE(bad);
    auto t = Tokenize(bad, LexOptions());
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(absl::StrContains(t.status().message(), "line ")) << t.status();
  }
  auto t = Tokenize("ab\ncd {{ x $ }}", LexOptions());
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "line 2, column 9")) << t.status();
}

TEST(LexerTest, GenerationTagsAreRemoved) {
  EXPECT_EQ(Describe("A {% generation %}B{% endgeneration %} C"),
            (std::vector<std::string>{"Text:A B C"}));
  EXPECT_EQ(Describe("A {%- generation -%} B"), (std::vector<std::string>{"Text:AB"}));
}

}  // namespace
}  // namespace tessera::text::jinja
