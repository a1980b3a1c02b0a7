#include "text/parsers/output_parser.h"

#include <chrono>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "text/parsers/block_tool_parser.h"
#include "text/parsers/parser_test_util.h"
#include "text/parsers/tag_scan.h"
#include "text/parsers/tool_call_emitter.h"

namespace tessera::text {
namespace {

using testing::Describe;
using testing::RandomCuts;
using testing::RunBytes;
using testing::RunCuts;
using testing::RunWhole;

// DeepSeek's special tokens, spelled with their full-width bar (U+FF5C) and
// lower one-eighth block (U+2581).
const std::string kCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kCallBegin = "<｜tool▁call▁begin｜>";
const std::string kCallEnd = "<｜tool▁call▁end｜>";
const std::string kSep = "<｜tool▁sep｜>";

OutputParserOptions Opts(std::string format, bool reasoning = false,
                         bool starts_in_reasoning = false) {
  OutputParserOptions o;
  o.tool_format = std::move(format);
  o.reasoning = reasoning;
  o.starts_in_reasoning = starts_in_reasoning;
  o.id_seed = 42;
  return o;
}

// Feeds `text` whole, byte by byte, cut at every single position, at every
// pair of positions (short texts) and at random cuts; all must agree.
ParsedMessage ExpectSplitInvariant(const OutputParserOptions& options, const std::string& text) {
  ParsedMessage whole = RunWhole(options, text);
  ParsedMessage bytes = RunBytes(options, text);
  EXPECT_TRUE(bytes == whole) << "bytes: " << Describe(bytes) << "\nwhole: " << Describe(whole);
  for (size_t i = 1; i < text.size(); ++i) {
    ParsedMessage one = RunCuts(options, text, {i});
    EXPECT_TRUE(one == whole) << "cut " << i << ": " << Describe(one);
    if (text.size() <= 200) {
      for (size_t j = i + 1; j < text.size(); ++j) {
        ParsedMessage two = RunCuts(options, text, {i, j});
        EXPECT_TRUE(two == whole) << "cuts " << i << "," << j << ": " << Describe(two);
      }
    }
  }
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    ParsedMessage r = RunCuts(options, text, RandomCuts(text.size(), &rng));
    EXPECT_TRUE(r == whole) << "random round " << round << ": " << Describe(r);
  }
  return whole;
}

ToolCall Call(std::string name, std::string arguments) {
  return ToolCall{"", std::move(name), std::move(arguments)};
}

void ExpectCalls(const ParsedMessage& m, const std::vector<ToolCall>& want) {
  ASSERT_EQ(m.tool_calls.size(), want.size()) << Describe(m);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i].name, want[i].name);
    EXPECT_EQ(m.tool_calls[i].arguments, want[i].arguments);
    EXPECT_TRUE(m.tool_calls[i].id.rfind("call_", 0) == 0);
    EXPECT_EQ(m.tool_calls[i].id.size(), 29u);
  }
}

// ---------------------------------------------------------------- factory

TEST(MakeOutputParserTest, UnknownFormatNamesTheKnownOnes) {
  auto parser = MakeOutputParser(Opts("hermes2"));
  ASSERT_FALSE(parser.ok());
  EXPECT_EQ(parser.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& f : KnownToolFormats()) {
    EXPECT_NE(parser.status().message().find(f), std::string::npos) << f;
  }
  EXPECT_NE(parser.status().message().find("hermes2"), std::string::npos);
}

TEST(MakeOutputParserTest, EveryKnownFormatBuilds) {
  for (const std::string& f : KnownToolFormats()) {
    EXPECT_TRUE(MakeOutputParser(Opts(f)).ok()) << f;
    EXPECT_TRUE(MakeOutputParser(Opts(f, true, true)).ok()) << f;
  }
}

TEST(NoneFormatTest, PassesEverythingThrough) {
  std::string text = "<tool_call>{\"name\":\"f\"}</tool_call><think>x</think>";
  ParsedMessage m = ExpectSplitInvariant(Opts("none"), text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.reasoning.empty());
  EXPECT_TRUE(m.tool_calls.empty());
}

// -------------------------------------------------------------- reasoning

TEST(ReasoningTest, SplitsThinkBlock) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("none", true), "<think>\nLet me think.\n</think>\n\nThe answer.");
  EXPECT_EQ(m.reasoning, "\nLet me think.\n");
  EXPECT_EQ(m.content, "\n\nThe answer.");
}

TEST(ReasoningTest, StartsInReasoningWithoutOpeningTag) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", false, true), "I reason.</think>Answer");
  EXPECT_EQ(m.reasoning, "I reason.");
  EXPECT_EQ(m.content, "Answer");
}

TEST(ReasoningTest, StartsInReasoningNeverClosedStaysReasoning) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", false, true), "cut off while thi");
  EXPECT_EQ(m.reasoning, "cut off while thi");
  EXPECT_TRUE(m.content.empty());
}

TEST(ReasoningTest, NoTagsIsAllContent) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", true), "Plain <b>x</b>");
  EXPECT_EQ(m.content, "Plain <b>x</b>");
  EXPECT_TRUE(m.reasoning.empty());
}

TEST(ReasoningTest, OnlyOneLeadingBlock) {
  // Later tags are content: an answer may quote them.
  ParsedMessage m = ExpectSplitInvariant(Opts("none", true), "<think>a</think>b<think>c</think>d");
  EXPECT_EQ(m.reasoning, "a");
  EXPECT_EQ(m.content, "b<think>c</think>d");
  // <think> opens reasoning only as the first non-whitespace.
  m = ExpectSplitInvariant(Opts("none", true), "x<think>a</think>b");
  EXPECT_EQ(m.content, "x<think>a</think>b");
  EXPECT_TRUE(m.reasoning.empty());
  m = ExpectSplitInvariant(Opts("none", true), " \n<think>a</think>b");
  EXPECT_EQ(m.reasoning, "a");
  EXPECT_EQ(m.content, "b");
}

TEST(ReasoningTest, StartsInReasoningDropsARepeatedOpenTag) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", false, true), "<think>\nwhy</think>ok");
  EXPECT_EQ(m.reasoning, "\nwhy");
  EXPECT_EQ(m.content, "ok");
  m = ExpectSplitInvariant(Opts("none", false, true), "\nwhy</think>ok");
  EXPECT_EQ(m.reasoning, "\nwhy");
}

TEST(ReasoningTest, UnicodeAroundTags) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("none", true), "<think>推理：∑ñ😀</think>答案🎉<think>");
  EXPECT_EQ(m.reasoning, "推理：∑ñ😀");
  EXPECT_EQ(m.content, "答案🎉<think>");
  m = ExpectSplitInvariant(Opts("none", false, true), "前言😀</think>答案");
  EXPECT_EQ(m.reasoning, "前言😀");
  EXPECT_EQ(m.content, "答案");
}

TEST(ReasoningTest, HoldsBackOnlyAPossibleTagPrefix) {
  auto parser = MakeOutputParser(Opts("none", true));
  ASSERT_TRUE(parser.ok());
  EXPECT_EQ((*parser)->Feed("\n<th").content, "");
  ParsedDelta d = (*parser)->Feed("ink>x</thi");
  EXPECT_EQ(d.reasoning, "x");
  EXPECT_EQ(d.content, "");
  d = (*parser)->Feed("s");  // "</this" is no tag prefix
  EXPECT_EQ(d.reasoning, "</this");
  d = (*parser)->Feed("<</");
  EXPECT_EQ(d.reasoning, "<");
  d = (*parser)->Feed("think>A<");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "A<");  // after reasoning nothing is held back
  EXPECT_TRUE((*parser)->Finish().empty());

  parser = MakeOutputParser(Opts("none", true));
  EXPECT_EQ((*parser)->Feed("<thi").content, "");
  EXPECT_EQ((*parser)->Feed("s is").content, "<this is");
}

TEST(ReasoningTest, PartialTagAtEndIsFlushedToCurrentStream) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", true), "<thin");
  EXPECT_EQ(m.content, "<thin");
  m = ExpectSplitInvariant(Opts("none", false, true), "why </thi");
  EXPECT_EQ(m.reasoning, "why </thi");
}

TEST(ReasoningTest, StrayCloseTagInContentIsContent) {
  ParsedMessage m = ExpectSplitInvariant(Opts("none", true), "a</think>b");
  EXPECT_EQ(m.content, "a</think>b");
}

TEST(ReasoningTest, LongLeadingWhitespaceStopsWaitingForTheTag) {
  std::string text = std::string(5000, ' ') + "<think>x</think>";
  ParsedMessage m = RunWhole(Opts("none", true), text);
  EXPECT_EQ(m.content, text);
  EXPECT_EQ(RunBytes(Opts("none", true), text), m);
}

TEST(ReasoningTest, TagsInToolArgumentsAfterReasoningSurvive) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3", true),
                           "<think>plan</think><tool_call>{\"name\":\"f\",\"arguments\":"
                           "{\"html\":\"<think>x</think>\"}}</tool_call>");
  EXPECT_EQ(m.reasoning, "plan");
  ExpectCalls(m, {Call("f", R"({"html":"<think>x</think>"})")});
}

TEST(ReasoningTest, PromptOpensReasoning) {
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptOpensReasoning("<think>"));
  EXPECT_FALSE(PromptOpensReasoning("<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(PromptOpensReasoning(""));
}

// ------------------------------------------------------------------ qwen3

TEST(Qwen3Test, OneCall) {
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"),
                                         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                         "{\"city\": \"Paris\", \"days\": 3}}\n</tool_call>");
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("get_weather", R"({"city":"Paris","days":3})")});
}

TEST(Qwen3Test, ContentBeforeAndAfterAndSeveralCalls) {
  std::string text =
      "Let me check both.\n\n"
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}\n"
      "</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n\n"
      "Done.";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
  EXPECT_EQ(m.content, "Let me check both.Done.");
  ExpectCalls(m, {Call("a", R"({"x":[1,2]})"), Call("b", "{}")});
  EXPECT_NE(m.tool_calls[0].id, m.tool_calls[1].id);
}

TEST(Qwen3Test, ArgumentsAsJsonStringOrMissing) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3"),
                           "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}"
                           "</tool_call><tool_call>{\"name\":\"g\"}</tool_call>");
  ExpectCalls(m, {Call("f", R"({"a":1})"), Call("g", "{}")});
}

TEST(Qwen3Test, UnicodeArgumentsAndBracesInStrings) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3"),
                           "天气？<tool_call>{\"name\":\"w\",\"arguments\":{\"city\":\"東京\","
                           "\"q\":\"}{\\\"\"}}</tool_call>🌤");
  EXPECT_EQ(m.content, "天气？🌤");
  ExpectCalls(m, {Call("w", R"({"city":"東京","q":"}{\""})")});
}

TEST(Qwen3Test, MalformedStaysContentVerbatim) {
  for (std::string text : {
           std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": "
                       "{\"a\": }\n</tool_call>"),
           std::string("<tool_call>[1, 2]</tool_call>"),
           std::string("<tool_call>{\"arguments\": {}}</tool_call>"),
           std::string("<tool_call>{\"name\": 7}</tool_call>"),
           std::string("<tool_call>{\"name\": \"\"}</tool_call>"),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": 3}"
                       "</tool_call>"),
           std::string("<tool_call>{\"name\":\"f\"} trailing</tool_call>"),
       }) {
    ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty());
  }
}

TEST(Qwen3Test, MalformedBetweenGoodCalls) {
  std::string bad = "<tool_call>{oops}</tool_call>";
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3"), "<tool_call>{\"name\":\"a\"}</tool_call>\n" + bad +
                                              "\n<tool_call>{\"name\":\"b\"}</tool_call>");
  EXPECT_EQ(m.content, bad);
  ExpectCalls(m, {Call("a", "{}"), Call("b", "{}")});
  EXPECT_EQ(m.tool_calls[1].id.size(), 29u);
}

TEST(Qwen3Test, UnterminatedAtFinishIsContent) {
  std::string text = "Sure. <tool_call>\n{\"name\": \"f\", \"argum";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(Qwen3Test, PrefixThatIsNotATag) {
  std::string text = "a <tool_cal> b <tool_c <tool";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
  EXPECT_EQ(m.content, text);
  auto parser = MakeOutputParser(Opts("qwen3"));
  ASSERT_TRUE(parser.ok());
  EXPECT_EQ((*parser)->Feed("x<tool_").content, "x");
  EXPECT_EQ((*parser)->Feed("cal!").content, "<tool_cal!");
}

TEST(Qwen3Test, ReasoningThenCallAndTagsInsideReasoning) {
  std::string text =
      "<think>Maybe <tool_call> is needed.</think>\n\n"
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": true}}\n"
      "</tool_call>";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3", true), text);
  EXPECT_EQ(m.reasoning, "Maybe <tool_call> is needed.");
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("f", R"({"k":true})")});
  // The same with the template having opened <think>.
  m = ExpectSplitInvariant(Opts("qwen3", false, true), text.substr(7));
  EXPECT_EQ(m.reasoning, "Maybe <tool_call> is needed.");
  ExpectCalls(m, {Call("f", R"({"k":true})")});
}

TEST(Qwen3Test, IdsDeterministicPerSeedAndRandomWithout) {
  std::string text = "<tool_call>{\"name\":\"a\"}</tool_call>";
  OutputParserOptions o = Opts("qwen3");
  std::string id1 = RunWhole(o, text).tool_calls.at(0).id;
  EXPECT_EQ(RunWhole(o, text).tool_calls.at(0).id, id1);
  o.id_seed = 43;
  EXPECT_NE(RunWhole(o, text).tool_calls.at(0).id, id1);
  o.id_seed = 0;
  std::string r1 = RunWhole(o, text).tool_calls.at(0).id;
  std::string r2 = RunWhole(o, text).tool_calls.at(0).id;
  EXPECT_NE(r1, r2);
  for (char c : r1.substr(5)) {
    EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) << r1;
  }
}

TEST(Qwen3Test, CallIsEmittedInTheDeltaThatClosesIt) {
  auto parser = MakeOutputParser(Opts("qwen3"));
  ASSERT_TRUE(parser.ok());
  EXPECT_TRUE((*parser)->Feed("<tool_call>{\"name\":\"f\",").empty());
  EXPECT_TRUE((*parser)->Feed("\"arguments\":{\"a\":1}}</tool_ca").empty());
  ParsedDelta d = (*parser)->Feed("ll>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"a":1})");
  EXPECT_TRUE((*parser)->Finish().empty());
}

TEST(Qwen3Test, DeepNestingIsContentNotACrash) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":" + deep + "}}</tool_call>";
  ParsedMessage m = RunWhole(Opts("qwen3"), text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(Qwen3Test, InvalidUtf8InsideJsonIsContent) {
  std::string text = "<tool_call>{\"name\":\"f\xff\"}</tool_call>";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
  EXPECT_EQ(m.content, text);
}

// ------------------------------------------------------------ llama3_json

TEST(Llama3JsonTest, PlainObject) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("llama3_json"), "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("get_weather", R"({"city":"Paris"})")});
}

TEST(Llama3JsonTest, PythonTagArgumentsKeyAndSeveral) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("llama3_json"),
                           " \n<|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": 1}}; "
                           "{\"name\": \"b\", \"parameters\": {}};\n"
                           "<|python_tag|>{\"name\": \"c\", \"parameters\": {\"s\": \"}{;\"}}\n");
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("a", R"({"x":1})"), Call("b", "{}"), Call("c", R"({"s":"}{;"})")});
}

TEST(Llama3JsonTest, OrdinaryTextIsContent) {
  for (std::string text : {std::string("Hello {\"name\": \"a\", \"parameters\": {}}"),
                           std::string("  The capital is Paris."), std::string("<|pytho"),
                           std::string("<b>bold</b>"), std::string(""), std::string(" \n ")}) {
    ParsedMessage m = ExpectSplitInvariant(Opts("llama3_json"), text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty());
  }
}

TEST(Llama3JsonTest, WrongShapeOrMalformedIsContentVerbatim) {
  for (std::string text : {
           std::string("{\"answer\": 42}"),
           std::string("{\"name\": \"Bob\"}"),  // no parameters: not a call
           std::string("{\"name\": \"f\", \"parameters\": [1]}"),
           std::string("{\"name\": \"f\", \"parameters\": {]}"),
           std::string("<|python_tag|>brave_search.call(query=\"x\")"),
           std::string("<|python_tag|>{\"name\": \"f\", \"parameters\": {"),
           std::string(" {\"name\": \"f\", \"parameters\": {}"),
       }) {
    ParsedMessage m = ExpectSplitInvariant(Opts("llama3_json"), text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty());
  }
}

TEST(Llama3JsonTest, TextAfterACallIsContent) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("llama3_json"),
                           "{\"name\": \"a\", \"parameters\": {}}\nI called it. {\"name\": \"b\", "
                           "\"parameters\": {}}");
  ExpectCalls(m, {Call("a", "{}")});
  EXPECT_EQ(m.content, "I called it. {\"name\": \"b\", \"parameters\": {}}");
  m = ExpectSplitInvariant(Opts("llama3_json"), "{\"name\": \"a\", \"parameters\": {}}; hello");
  ExpectCalls(m, {Call("a", "{}")});
  EXPECT_EQ(m.content, "hello");
}

TEST(Llama3JsonTest, BadSecondObjectKeepsFirstCall) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("llama3_json"), "{\"name\": \"a\", \"parameters\": {}}; {\"oops\": 1}; tail");
  ExpectCalls(m, {Call("a", "{}")});
  EXPECT_EQ(m.content, "{\"oops\": 1}; tail");
}

TEST(Llama3JsonTest, ReasoningFirst) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("llama3_json", true),
                           "<think>use a tool</think>\n{\"name\": \"a\", \"parameters\": {}}");
  EXPECT_EQ(m.reasoning, "use a tool");
  ExpectCalls(m, {Call("a", "{}")});
}

TEST(Llama3JsonTest, DecidesContentWithoutWaiting) {
  auto parser = MakeOutputParser(Opts("llama3_json"));
  ASSERT_TRUE(parser.ok());
  EXPECT_EQ((*parser)->Feed("  ").content, "");
  EXPECT_EQ((*parser)->Feed("Hi").content, "  Hi");
  parser = MakeOutputParser(Opts("llama3_json"));
  EXPECT_EQ((*parser)->Feed("<|py").content, "");
  EXPECT_EQ((*parser)->Feed("x").content, "<|pyx");
}

// ------------------------------------------------------------ deepseek_v3

std::string DsV3Call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}

TEST(DeepSeekV3Test, TemplateFormatOneCall) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3"),
      kCallsBegin + DsV3Call("get_weather", "{\"city\": \"Paris\"}") + kCallsEnd);
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("get_weather", R"({"city":"Paris"})")});
}

TEST(DeepSeekV3Test, SeveralCallsWithContentBefore) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3"), "好的。\n" + kCallsBegin + DsV3Call("a", "{\"x\": 1}") + "\n" +
                               DsV3Call("b", "{}") + kCallsEnd + "<｜end▁of▁sentence｜>");
  EXPECT_EQ(m.content, "好的。<｜end▁of▁sentence｜>");
  ExpectCalls(m, {Call("a", R"({"x":1})"), Call("b", "{}")});
}

TEST(DeepSeekV3Test, V31WithoutTypeAndFence) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3"), kCallsBegin + kCallBegin + "get_weather" + kSep +
                               "{\"city\": \"Paris\"}" + kCallEnd + kCallBegin + "noop" + kSep +
                               "{}" + kCallEnd + kCallsEnd);
  ExpectCalls(m, {Call("get_weather", R"({"city":"Paris"})"), Call("noop", "{}")});
}

TEST(DeepSeekV3Test, V3WithoutFenceAndCallWithoutSection) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3"), kCallBegin + "function" + kSep + "f\n{\"a\": [true]}" + kCallEnd);
  ExpectCalls(m, {Call("f", R"({"a":[true]})")});
}

TEST(DeepSeekV3Test, MalformedAndUnterminatedStayContent) {
  for (std::string text : {
           kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{bad" + "\n```" + kCallEnd +
               kCallsEnd,
           kCallsBegin + kCallBegin + "no separator {}" + kCallEnd + kCallsEnd,
           kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{",
           kCallsBegin + "junk" + kCallsEnd,
           kCallsBegin,
           kCallBegin + "two words" + kSep + "{}" + kCallEnd,
           std::string("<｜tool▁call"),
       }) {
    ParsedMessage m = ExpectSplitInvariant(Opts("deepseek_v3"), text);
    EXPECT_EQ(m.content, text);
    EXPECT_TRUE(m.tool_calls.empty());
  }
}

TEST(DeepSeekV3Test, R1StyleReasoningThenCalls) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3", false, true),
      "需要天气。</think>\n\n" + kCallsBegin + DsV3Call("w", "{\"c\": \"北京\"}") + kCallsEnd);
  EXPECT_EQ(m.reasoning, "需要天气。");
  EXPECT_EQ(m.content, "");
  ExpectCalls(m, {Call("w", R"({"c":"北京"})")});
}

TEST(DeepSeekV3Test, BodyParser) {
  auto v3 = ParseDeepSeekBody("function" + kSep + "f\n```json\n{}\n```");
  ASSERT_TRUE(v3.has_value());
  EXPECT_EQ(v3->name, "f");
  // A V3.1 function that happens to be called "function".
  auto v31 = ParseDeepSeekBody("function" + kSep + "{\"a\":1}");
  ASSERT_TRUE(v31.has_value());
  EXPECT_EQ(v31->name, "function");
  EXPECT_EQ(v31->arguments, R"({"a":1})");
  EXPECT_FALSE(ParseDeepSeekBody("f" + kSep + "[1]").has_value());
  EXPECT_FALSE(ParseDeepSeekBody(kSep + "{}").has_value());
}

// --------------------------------------------------------- default format

TEST(DefaultToolFormatTest, FromTemplateThenModelType) {
  EXPECT_EQ(DefaultToolFormat("qwen3", "{{- '<tool_call>\\n{\"name\": \"' }}"), "qwen3");
  EXPECT_EQ(DefaultToolFormat("deepseek_v3", "{{'<｜Assistant｜><｜tool▁calls▁begin｜>'}}"),
            "deepseek_v3");
  EXPECT_EQ(DefaultToolFormat("llama",
                              "{%- if tools %}<|start_header_id|>ipython"
                              "{{- \"<|python_tag|>\" }}"),
            "llama3_json");
  EXPECT_EQ(DefaultToolFormat("llama",
                              "{% if custom_tools %}{{ tools }}{% endif %}"
                              "<|start_header_id|>"),
            "llama3_json");
  // A template without any tool format: none, whatever the model type.
  EXPECT_EQ(DefaultToolFormat("qwen2", "<|im_start|>{{ message }}"), "none");
  EXPECT_EQ(DefaultToolFormat("llama", "<|start_header_id|>{{ m }}"), "none");
  // No template: model type.
  EXPECT_EQ(DefaultToolFormat("qwen2", ""), "qwen3");
  EXPECT_EQ(DefaultToolFormat("qwen3_moe", ""), "qwen3");
  EXPECT_EQ(DefaultToolFormat("deepseek_v3", ""), "deepseek_v3");
  EXPECT_EQ(DefaultToolFormat("llama", ""), "none");
  EXPECT_EQ(DefaultToolFormat("", ""), "none");
}

// ---------------------------------------------------------- huge inputs

// A block that never closes is buffered only up to max_block_bytes, then
// released as content, and the rest streams through; time stays linear.
void ExpectBoundedNeverClosing(const std::string& format, const std::string& opener) {
  OutputParserOptions o = Opts(format);  // default cap: 1 MiB
  auto parser = MakeOutputParser(o);
  ASSERT_TRUE(parser.ok());
  const size_t total = 10u << 20;
  const std::string chunk(4096, 'x');
  auto start = std::chrono::steady_clock::now();
  ParsedMessage m;
  Accumulate((*parser)->Feed(opener), &m);
  size_t fed = opener.size();
  size_t max_held = 0;
  while (fed < total) {
    Accumulate((*parser)->Feed(chunk), &m);
    fed += chunk.size();
    size_t held = fed - m.content.size();
    max_held = std::max(max_held, held);
  }
  Accumulate((*parser)->Finish(), &m);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(m.content.size(), fed);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_LE(max_held, o.max_block_bytes + 2 * chunk.size() + opener.size());
  EXPECT_LT(seconds, 5.0);
}

TEST(HugeInputTest, NeverClosingQwen3Block) {
  ExpectBoundedNeverClosing("qwen3", "<tool_call>\n{\"name\": \"f\", \"a\": \"");
}

TEST(HugeInputTest, NeverClosingDeepSeekCall) {
  ExpectBoundedNeverClosing("deepseek_v3", kCallsBegin + kCallBegin);
}

TEST(HugeInputTest, NeverClosingLlamaObject) {
  ExpectBoundedNeverClosing("llama3_json", "{\"name\": \"f\", \"parameters\": {");
}

TEST(HugeInputTest, LongReasoningStreamsThrough) {
  auto parser = MakeOutputParser(Opts("qwen3", true));
  ASSERT_TRUE(parser.ok());
  (*parser)->Feed("<think>");
  const std::string chunk(4096, 'r');
  for (int i = 0; i < 2560; ++i) {
    ASSERT_EQ((*parser)->Feed(chunk).reasoning.size(), chunk.size());
  }
  EXPECT_TRUE((*parser)->Finish().empty());
}

TEST(HugeInputTest, WholeBlockOverCapInOneFeedIsContent) {
  OutputParserOptions o = Opts("qwen3");
  o.max_block_bytes = 64;
  std::string args(100, 'a');
  std::string text =
      "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":\"" + args + "\"}}</tool_call>";
  ParsedMessage m = ExpectSplitInvariant(o, text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
  o.max_block_bytes = 1 << 20;
  ExpectCalls(RunWhole(o, text), {Call("f", "{\"a\":\"" + args + "\"}")});
}

TEST(WhitespaceRuleTest, ShortRunsTouchingACallAreDroppedLongOnesKept) {
  const std::string call = "<tool_call>{\"name\":\"f\"}</tool_call>";
  std::string short_run(10, '\n');
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), "a" + short_run + call + "  b ");
  EXPECT_EQ(m.content, "ab ");
  std::string long_run(ToolCallEmitter::kMaxHeldWhitespace + 1, ' ');
  m = RunWhole(Opts("qwen3"), "a" + long_run + call);
  EXPECT_EQ(m.content, "a" + long_run);
  std::mt19937_64 rng(3);
  for (int round = 0; round < 20; ++round) {
    std::string text = "a" + long_run + call;
    ParsedMessage r = RunCuts(Opts("qwen3"), text, RandomCuts(text.size(), &rng));
    EXPECT_EQ(r.content, m.content);
  }
}

}  // namespace
}  // namespace tessera::text

namespace tessera::text {
namespace {

// ------------------------------------------------------------- edge cases

TEST(EdgeCaseTest, EmptyFeedsAndFinishWithoutFeed) {
  for (const std::string& f : KnownToolFormats()) {
    for (bool r : {false, true}) {
      auto parser = MakeOutputParser(Opts(f, r));
      ASSERT_TRUE(parser.ok());
      EXPECT_TRUE((*parser)->Feed("").empty()) << f;
      EXPECT_TRUE((*parser)->Finish().empty()) << f;
    }
  }
}

TEST(EdgeCaseTest, ManyCallsGetConsecutiveIndexesAndDistinctIds) {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text += absl::StrCat("<tool_call>{\"name\":\"f", i, "\",\"arguments\":{\"i\":", i,
                         "}}</tool_call>\n");
  }
  auto parser = MakeOutputParser(Opts("qwen3"));
  ASSERT_TRUE(parser.ok());
  std::vector<ToolCallDelta> calls;
  std::mt19937_64 rng(5);
  size_t at = 0;
  for (size_t cut : RandomCuts(text.size(), &rng)) {
    for (auto& c : (*parser)->Feed(text.substr(at, cut - at)).tool_calls) {
      calls.push_back(c);
    }
    at = cut;
  }
  for (auto& c : (*parser)->Feed(text.substr(at)).tool_calls) {
    calls.push_back(c);
  }
  EXPECT_TRUE((*parser)->Finish().empty());
  ASSERT_EQ(calls.size(), 500u);
  std::set<std::string> ids;
  for (int i = 0; i < 500; ++i) {
    EXPECT_EQ(calls[i].index, i);
    EXPECT_EQ(calls[i].name, absl::StrCat("f", i));
    EXPECT_EQ(calls[i].arguments, absl::StrCat("{\"i\":", i, "}"));
    ids.insert(calls[i].id);
  }
  EXPECT_EQ(ids.size(), 500u);
}

TEST(EdgeCaseTest, Qwen3LenientBodies) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3"),
                           "<tool_call>\n```json\n{\"name\": \"f\", \"arguments\": {}}\n```\n"
                           "</tool_call><tool_call>{\"name\": \"g\", \"arguments\": \"\"}"
                           "</tool_call><tool_call>{\"name\": \"h\", \"arguments\": null, "
                           "\"id\": 3}</tool_call>");
  ExpectCalls(m, {Call("f", "{}"), Call("g", "{}"), Call("h", "{}")});
}

TEST(EdgeCaseTest, JsonEscapesAndNumbersAreNormalized) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("qwen3"),
                           "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\u00e9\\n\\\"\","
                           " \"n\": -1.5e2, \"big\": 18446744073709551615, \"b\": false, "
                           "\"z\": null, \"e\": {}, \"l\": []}}</tool_call>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments,
            "{\"b\":false,\"big\":18446744073709551615,\"e\":{},\"l\":[],"
            "\"n\":-150.0,\"s\":\"é\\n\\\"\",\"z\":null}");
}

TEST(EdgeCaseTest, EndTagInsideAStringClosesTheBlockEarly) {
  // A documented limitation shared with other servers: the first end tag
  // ends the block. The block then fails to parse and is content, whole.
  std::string text =
      "<tool_call>{\"name\":\"f\",\"arguments\":{\"s\":\"</tool_call>\"}}"
      "</tool_call>";
  ParsedMessage m = ExpectSplitInvariant(Opts("qwen3"), text);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(EdgeCaseTest, Llama3AdjacentObjectsAndTagThenSpace) {
  ParsedMessage m = ExpectSplitInvariant(Opts("llama3_json"),
                                         "<|python_tag|> \n{\"name\":\"a\",\"parameters\":{}}"
                                         "{\"name\":\"b\",\"parameters\":{\"x\":\"\\\\\"}}");
  ExpectCalls(m, {Call("a", "{}"), Call("b", R"({"x":"\\"})")});
  EXPECT_EQ(m.content, "");
}

TEST(EdgeCaseTest, Llama3TrailingSeparatorsAndBareTagAfterCall) {
  ParsedMessage m =
      ExpectSplitInvariant(Opts("llama3_json"), "{\"name\":\"a\",\"parameters\":{}} ;\n; ");
  ExpectCalls(m, {Call("a", "{}")});
  EXPECT_EQ(m.content, "");
  m = ExpectSplitInvariant(Opts("llama3_json"),
                           "{\"name\":\"a\",\"parameters\":{}};<|python_tag|>");
  ExpectCalls(m, {Call("a", "{}")});
  EXPECT_EQ(m.content, "<|python_tag|>");
}

TEST(EdgeCaseTest, Llama3DeepNestingIsContent) {
  std::string text =
      "{\"name\":\"f\",\"parameters\":" + std::string(1000, '[') + std::string(1000, ']') + "}";
  ParsedMessage m = RunWhole(Opts("llama3_json"), text);
  EXPECT_EQ(m.content, text);
  EXPECT_EQ(RunBytes(Opts("llama3_json"), text), m);
}

TEST(EdgeCaseTest, DeepSeekNamesAndStrayTextInSection) {
  ParsedMessage m = ExpectSplitInvariant(
      Opts("deepseek_v3"), kCallsBegin + "\n" + DsV3Call("pkg.get_weather", "{}") + " stray " +
                               DsV3Call("b", "{\"k\": \"```\"}") + "\n" + kCallsEnd + "after");
  ExpectCalls(m, {Call("pkg.get_weather", "{}"), Call("b", R"({"k":"```"})")});
  EXPECT_EQ(m.content, "strayafter");
}

TEST(EdgeCaseTest, DeepSeekTagsInsideReasoningAreReasoning) {
  std::string inner = kCallsBegin + DsV3Call("x", "{}") + kCallsEnd;
  ParsedMessage m =
      ExpectSplitInvariant(Opts("deepseek_v3", false, true), "I could " + inner + "</think>ok");
  EXPECT_EQ(m.reasoning, "I could " + inner);
  EXPECT_EQ(m.content, "ok");
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(EdgeCaseTest, DeepSeekSectionWithoutCallsKeepsItsTags) {
  std::string text = "a" + kCallsBegin + "  \n " + kCallsEnd + "b";
  ParsedMessage m = ExpectSplitInvariant(Opts("deepseek_v3"), text);
  EXPECT_EQ(m.content, text);
}

TEST(EdgeCaseTest, FormatsIgnoreEachOthersTags) {
  std::string qwen = "<tool_call>{\"name\":\"f\"}</tool_call>";
  std::string ds = kCallsBegin + DsV3Call("f", "{}") + kCallsEnd;
  EXPECT_EQ(RunWhole(Opts("deepseek_v3"), qwen).content, qwen);
  EXPECT_EQ(RunWhole(Opts("qwen3"), ds).content, ds);
  EXPECT_EQ(RunWhole(Opts("llama3_json"), qwen).content, qwen);
}

TEST(EdgeCaseTest, AccumulateMergesFragmentsByIndex) {
  ParsedMessage m;
  ParsedDelta a;
  a.content = "x";
  a.tool_calls.push_back({0, "call_1", "f", "{\"a\""});
  ParsedDelta b;
  b.reasoning = "r";
  b.tool_calls.push_back({0, "", "", ":1}"});
  b.tool_calls.push_back({1, "call_2", "g", "{}"});
  Accumulate(a, &m);
  Accumulate(b, &m);
  EXPECT_EQ(m.content, "x");
  EXPECT_EQ(m.reasoning, "r");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0], (ToolCall{"call_1", "f", "{\"a\":1}"}));
  EXPECT_EQ(m.tool_calls[1], (ToolCall{"call_2", "g", "{}"}));
}

}  // namespace
}  // namespace tessera::text

namespace tessera::text {
namespace {

TEST(TagScanTest, FindsEarliestAndLongestTag) {
  TagMatch m = FindFirstTag("ab<x><xy>", {"<xy>", "<x>"});
  EXPECT_EQ(m.pos, 2u);
  EXPECT_EQ(m.tag, 1u);
  m = FindFirstTag("<ab", {"<a", "<ab"});
  EXPECT_EQ(m.pos, 0u);
  EXPECT_EQ(m.tag, 1u);
  EXPECT_EQ(FindFirstTag("none", {"<a>"}).pos, std::string::npos);
  EXPECT_EQ(FindFirstTag("<a><a>", {"<a>"}, 1).pos, 3u);
}

TEST(TagScanTest, PartialSuffixIsTheLongestTagPrefix) {
  EXPECT_EQ(PartialTagSuffix("text<tool_", {"<tool_call>"}), 6u);
  EXPECT_EQ(PartialTagSuffix("text<tool_call>", {"<tool_call>"}), 0u);
  EXPECT_EQ(PartialTagSuffix("a<", {"<x>", "</y>"}), 1u);
  EXPECT_EQ(PartialTagSuffix("a</", {"<x>", "</y>"}), 2u);
  EXPECT_EQ(PartialTagSuffix("<x", {"<x>"}), 2u);
  EXPECT_EQ(PartialTagSuffix("", {"<x>"}), 0u);
  EXPECT_EQ(PartialTagSuffix("xyz", {"<x>"}), 0u);
  // A multi-byte tag cut inside one of its UTF-8 sequences.
  std::string cut = kCallBegin.substr(0, 2);
  EXPECT_EQ(PartialTagSuffix("好" + cut, {kCallBegin}), 2u);
}

}  // namespace
}  // namespace tessera::text

namespace tessera::text {
namespace {

TEST(HugeInputTest, LlamaLongSeparatorsBetweenManyCallsStayLinear) {
  std::string text;
  const std::string gap = ";" + std::string(4000, ' ') + "<|python_tag|>" + std::string(80, '\n');
  for (int i = 0; i < 500; ++i) {
    if (i > 0) text += gap;
    text += "{\"name\":\"f\",\"parameters\":{}}";
  }
  auto start = std::chrono::steady_clock::now();
  ParsedMessage m = RunBytes(Opts("llama3_json"), text);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(m.tool_calls.size(), 500u);
  EXPECT_EQ(m.content, "");
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace tessera::text
