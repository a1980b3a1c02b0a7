// Added tokens (special and user-added tokens of tokenizer.json's
// "added_tokens") and the matcher that finds them in text before BPE runs.
//
// Matching is leftmost-longest over raw bytes, like the Aho-Corasick
// automaton of Hugging Face tokenizers. Per-token attributes:
//   single_word  the match must not touch a word character (\w) on either side;
//   lstrip       the match absorbs the white space to its left;
//   rstrip       the match absorbs the white space to its right;
//   normalized   the token is matched in normalized text (second pass) rather
//                than in the raw input (first pass);
//   special      skipped by Decode(skip_special_tokens) and not matched when
//                encoding with split_special_tokens.
//
// Thread-safety: immutable after construction; Split is safe to call
// concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One piece of input after added-token matching.
struct Segment {
  std::string_view text;
  // Index into the matcher's token list, or -1 for ordinary text.
  int token = -1;
};

class AddedTokenMatcher {
 public:
  // `tokens` must outlive the matcher. Tokens with empty content are ignored.
  explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);

  bool empty() const { return tokens_.empty(); }
  const AddedToken& token(int index) const { return *tokens_[index]; }

  // Cuts `text` into segments that cover it in order, ordinary text and
  // matched tokens alternating (ordinary segments are never empty). With
  // `skip_special`, tokens marked special are not matched.
  // REQUIRES: `text` is valid UTF-8.
  void Split(std::string_view text, bool skip_special, std::vector<Segment>* out) const;

 private:
  struct Node {
    // Children sorted by byte.
    std::vector<std::pair<unsigned char, int32_t>> children;
    // Token index ending here, or -1.
    int32_t terminal = -1;
  };
  int32_t Child(int32_t node, unsigned char byte) const;

  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace tessera::tokenizer
