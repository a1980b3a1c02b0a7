// Test helpers for the output parsers: feed a text whole, byte by byte or
// split at given positions, and collect the assembled message.
//
// Thread-safety: test-only free functions; no shared state.
#pragma once

#include <cstddef>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "text/parsers/output_parser.h"

namespace tessera::text::testing {

inline std::string Describe(const ParsedMessage& m) {
  std::string s = "content=[" + m.content + "] reasoning=[" + m.reasoning + "] calls=";
  for (const ToolCall& c : m.tool_calls) {
    s += "{" + c.id + " " + c.name + " " + c.arguments + "}";
  }
  return s;
}

// Feeds `text` cut at the sorted positions `cuts` and finishes. Checks the
// OpenAI delta shape on the way: each call's first delta has id and name.
inline ParsedMessage RunCuts(const OutputParserOptions& options, absl::string_view text,
                             const std::vector<size_t>& cuts) {
  auto parser = MakeOutputParser(options);
  EXPECT_TRUE(parser.ok()) << parser.status();
  ParsedMessage message;
  auto take = [&](const ParsedDelta& delta) {
    size_t known = message.tool_calls.size();
    for (const ToolCallDelta& call : delta.tool_calls) {
      if (static_cast<size_t>(call.index) >= known) {
        EXPECT_EQ(static_cast<size_t>(call.index), known);
        EXPECT_FALSE(call.id.empty());
        EXPECT_FALSE(call.name.empty());
        known = call.index + 1;
      }
    }
    Accumulate(delta, &message);
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take((*parser)->Feed(text.substr(at, cut - at)));
    at = cut;
  }
  take((*parser)->Feed(text.substr(at)));
  take((*parser)->Finish());
  return message;
}

inline ParsedMessage RunWhole(const OutputParserOptions& options, absl::string_view text) {
  return RunCuts(options, text, {});
}

inline ParsedMessage RunBytes(const OutputParserOptions& options, absl::string_view text) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
  return RunCuts(options, text, cuts);
}

inline std::vector<size_t> RandomCuts(size_t size, std::mt19937_64* rng) {
  std::vector<size_t> cuts;
  if (size < 2) return cuts;
  size_t at = 0;
  while (true) {
    at += 1 + (*rng)() % 9;
    if (at >= size) break;
    cuts.push_back(at);
  }
  return cuts;
}

}  // namespace tessera::text::testing
