// Randomized test: texts assembled from tag fragments, JSON pieces, unicode
// and noise, fed under every format and reasoning mode with random splits
// and byte by byte. Properties: the result never depends on the split; every
// emitted call has a name, a "call_" id and arguments that parse as a JSON
// object; with no call parsed (and no reasoning), content equals the input.
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "text/parsers/output_parser.h"
#include "text/parsers/parser_test_util.h"

namespace tessera::text {
namespace {

using testing::Describe;
using testing::RandomCuts;
using testing::RunBytes;
using testing::RunCuts;
using testing::RunWhole;

const std::vector<std::string>& Fragments() {
  static const std::vector<std::string>* f = new std::vector<std::string>{
      "<think>",
      "</think>",
      "<thi",
      "</th",
      "<",
      "</",
      ">",
      "<tool_call>",
      "</tool_call>",
      "<tool_",
      "</tool_c",
      "<|python_tag|>",
      "<|pyt",
      "<｜tool▁calls▁begin｜>",
      "<｜tool▁calls▁end｜>",
      "<｜tool▁call▁begin｜>",
      "<｜tool▁call▁end｜>",
      "<｜tool▁sep｜>",
      "<｜tool▁",
      "function",
      "\n```json\n",
      "\n```",
      "{",
      "}",
      "[",
      "]",
      "\"",
      "\\",
      "\\\"",
      ":",
      ",",
      ";",
      " ",
      "\n",
      "\n\n",
      "\t",
      "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
      "{\"name\": \"g\", \"parameters\": {\"s\": \"}{\\\"\"}}",
      "{\"name\": \"h\"}",
      "{\"a\": [1, {\"b\": null}]}",
      "{}",
      "get_weather",
      "東京",
      "😀",
      "ñ",
      "∑",
      "\xff",
      "hello",
      "The answer is 42.",
      "\"name\"",
      "\"arguments\"",
      "true",
      "1e5",
      "-0.5",
  };
  return *f;
}

std::string RandomText(std::mt19937_64* rng) {
  std::string text;
  int pieces = 1 + static_cast<int>((*rng)() % 24);
  const auto& f = Fragments();
  for (int i = 0; i < pieces; ++i) text += f[(*rng)() % f.size()];
  return text;
}

// Structured texts that often parse, so the call paths get exercised.
std::string RandomCallText(const std::string& format, std::mt19937_64* rng) {
  auto pick = [&](std::initializer_list<std::string> options) {
    auto it = options.begin();
    std::advance(it, (*rng)() % options.size());
    return *it;
  };
  std::string args =
      pick({"{}", "{\"a\": 1}", "{\"q\": \"x}y\"}", "{\"l\": [1, 2, {\"k\": \"東京\"}]}", "{bad"});
  std::string name = pick({"f", "get_weather", "a_b"});
  std::string out = pick({"", "Sure. ", "\n", "<think>hm</think>"});
  int calls = 1 + static_cast<int>((*rng)() % 3);
  for (int i = 0; i < calls; ++i) {
    if (format == "qwen3") {
      out += "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args +
             "}\n</tool_call>" + pick({"", "\n", " x "});
    } else if (format == "llama3_json") {
      out += pick({"", "<|python_tag|>"}) + "{\"name\": \"" + name + "\", \"parameters\": " + args +
             "}" + pick({"", "; ", "\n", "x"});
    } else {
      out += pick({"", "<｜tool▁calls▁begin｜>"}) + "<｜tool▁call▁begin｜>" +
             pick({"function<｜tool▁sep｜>" + name + "\n```json\n" + args + "\n```",
                   name + "<｜tool▁sep｜>" + args}) +
             "<｜tool▁call▁end｜>" + pick({"", "\n", "<｜tool▁calls▁end｜>"});
    }
  }
  if ((*rng)() % 4 == 0) out.resize((*rng)() % (out.size() + 1));
  return out;
}

void CheckProperties(const OutputParserOptions& options, const std::string& text,
                     std::mt19937_64* rng) {
  ParsedMessage whole = RunWhole(options, text);
  ParsedMessage bytes = RunBytes(options, text);
  ASSERT_TRUE(bytes == whole) << "format=" << options.tool_format << " text=[" << text
                              << "]\nbytes " << Describe(bytes) << "\nwhole " << Describe(whole);
  for (int i = 0; i < 3; ++i) {
    ParsedMessage r = RunCuts(options, text, RandomCuts(text.size(), rng));
    ASSERT_TRUE(r == whole) << "format=" << options.tool_format << " text=[" << text << "]\nsplit "
                            << Describe(r) << "\nwhole " << Describe(whole);
  }
  for (const ToolCall& call : whole.tool_calls) {
    EXPECT_FALSE(call.name.empty());
    EXPECT_EQ(call.id.rfind("call_", 0), 0u);
    auto args = nlohmann::json::parse(call.arguments, nullptr, false);
    EXPECT_TRUE(!args.is_discarded() && args.is_object()) << call.arguments;
    // Compact: serializing again gives the same bytes.
    if (!args.is_discarded()) {
      EXPECT_EQ(args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                call.arguments);
    }
  }
  bool plain = !options.reasoning && !options.starts_in_reasoning;
  if (plain && whole.tool_calls.empty()) {
    EXPECT_EQ(whole.content, text) << options.tool_format;
  }
  if (options.tool_format == "none" && plain) {
    EXPECT_EQ(whole.content, text);
  }
}

TEST(OutputParserFuzzTest, RandomTextsAreSplitInvariant) {
  std::mt19937_64 rng(20261202);
  for (int iter = 0; iter < 1500; ++iter) {
    std::string text = RandomText(&rng);
    for (const std::string& format : KnownToolFormats()) {
      for (int mode = 0; mode < 3; ++mode) {
        OutputParserOptions o;
        o.tool_format = format;
        o.reasoning = mode == 1;
        o.starts_in_reasoning = mode == 2;
        o.id_seed = 1 + iter;
        o.max_block_bytes = 1 + rng() % 200;  // exercise the cap as well
        CheckProperties(o, text, &rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(OutputParserFuzzTest, RandomCallTextsAreSplitInvariant) {
  std::mt19937_64 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    for (std::string format : {"qwen3", "llama3_json", "deepseek_v3"}) {
      std::string text = RandomCallText(format, &rng);
      OutputParserOptions o;
      o.tool_format = format;
      o.reasoning = iter % 2 == 0;
      o.id_seed = 1 + iter;
      CheckProperties(o, text, &rng);
      if (HasFatalFailure()) return;
      parsed += RunWhole(o, text).tool_calls.size();
    }
  }
  EXPECT_GT(parsed, 2000);  // the generator really produces calls
}

}  // namespace
}  // namespace tessera::text
