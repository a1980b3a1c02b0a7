// Test helpers: builds small tokenizer.json documents by hand, so unit tests
// can state expected ids that follow from the merges they define.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "text/tokenizer/byte_level.h"

namespace tessera::tokenizer::testing {

// A byte-level BPE tokenizer.json whose ids 0..255 are the single bytes (id
// == byte value) and whose merges get ids 256, 257, ... in order. Merges are
// given as raw byte strings, e.g. {"h", "e"} then {"he", "l"}.
struct TinySpec {
  std::vector<std::pair<std::string, std::string>> merges;
  // Merges as "a b" strings (old format) instead of [a, b] pairs.
  bool string_merges = false;
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json normalizer = nullptr;
  nlohmann::json post_processor = nullptr;
  // Same shape as Qwen's: Split with this pattern, then ByteLevel.
  std::string pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  bool ignore_merges = false;
};

// Id of merge number `i` (0-based) in a TinySpec.
inline int MergeId(int i) { return 256 + i; }

inline nlohmann::json TinyTokenizerJson(const TinySpec& spec) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[BytesToByteLevel(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json merges = nlohmann::json::array();
  int next_id = 256;
  for (const auto& [left, right] : spec.merges) {
    const std::string l = BytesToByteLevel(left), r = BytesToByteLevel(right);
    vocab[l + r] = next_id++;
    if (spec.string_merges) {
      merges.push_back(l + " " + r);
    } else {
      merges.push_back(nlohmann::json::array({l, r}));
    }
  }
  nlohmann::json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = spec.added_tokens;
  root["normalizer"] = spec.normalizer;
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       nlohmann::json::array(
           {{{"type", "Split"},
             {"pattern", {{"Regex", spec.pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  root["post_processor"] = spec.post_processor;
  root["decoder"] = {{"type", "ByteLevel"}};
  root["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                   {"unk_token", nullptr},   {"fuse_unk", false},
                   {"byte_fallback", false}, {"ignore_merges", spec.ignore_merges},
                   {"vocab", vocab},         {"merges", merges}};
  return root;
}

inline nlohmann::json AddedTokenJson(int id, const std::string& content, bool special,
                                     bool lstrip = false, bool rstrip = false,
                                     bool normalized = false, bool single_word = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

}  // namespace tessera::tokenizer::testing
