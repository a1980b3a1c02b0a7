#include "text/tokenizer/added_tokens.h"

#include <algorithm>

#include "text/tokenizer/unicode.h"
#include "text/tokenizer/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace tessera::tokenizer {
namespace {

// The code point that ends just before byte offset `end`.
// REQUIRES: text valid UTF-8, end > 0 and on a code point boundary.
char32_t CodePointBefore(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  int len = 0;
  return DecodeUtf8At(text, begin, &len);
}

// Unicode \w (letters, digits, underscore) as PCRE2 defines it in UCP mode.
// Only used for single_word tokens, which neither Qwen nor Llama-3 defines.
bool IsWordChar(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  static pcre2_code* const word = [] {
    int error = 0;
    PCRE2_SIZE offset = 0;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^\\w"), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  }();
  if (word == nullptr) return false;
  std::string utf8;
  AppendUtf8(cp, &utf8);
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  if (data == nullptr) return false;
  const int rc = pcre2_match(word, reinterpret_cast<PCRE2_SPTR>(utf8.data()), utf8.size(), 0,
                             PCRE2_NO_UTF_CHECK, data, nullptr);
  pcre2_match_data_free(data);
  return rc > 0;
}

size_t SkipWhiteSpaceBackward(std::string_view text, size_t end, size_t floor) {
  while (end > floor) {
    size_t begin = end - 1;
    while (begin > floor && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
    int len = 0;
    if (!IsWhiteSpace(DecodeUtf8At(text, begin, &len))) break;
    end = begin;
  }
  return end;
}

size_t SkipWhiteSpaceForward(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    int len = 0;
    if (!IsWhiteSpace(DecodeUtf8At(text, begin, &len))) break;
    begin += len;
  }
  return begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens) {
  nodes_.emplace_back();
  for (const AddedToken* token : tokens) {
    if (token->content.empty()) continue;
    const int32_t index = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
    int32_t node = 0;
    for (unsigned char b : token->content) {
      int32_t next = Child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1})),
            {b, next});
        nodes_.emplace_back();  // May move nodes_; `children` is not used after.
      }
      node = next;
    }
    // A later duplicate of the same content replaces the earlier one.
    nodes_[node].terminal = index;
    first_byte_[static_cast<unsigned char>(token->content[0])] = true;
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  if (it == children.end() || it->first != byte) return -1;
  return it->second;
}

void AddedTokenMatcher::Split(std::string_view text, bool skip_special,
                              std::vector<Segment>* out) const {
  size_t emitted = 0;  // Start of text not yet placed in a segment.
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest token starting at `pos`.
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      const int32_t t = nodes_[node].terminal;
      if (t >= 0 && !(skip_special && tokens_[t]->special)) {
        best = t;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = *tokens_[best];
    size_t start = pos;
    size_t stop = best_end;
    if (token.single_word) {
      const bool left_ok = start == 0 || !IsWordChar(CodePointBefore(text, start));
      int len = 0;
      const bool right_ok = stop == text.size() || !IsWordChar(DecodeUtf8At(text, stop, &len));
      if (!left_ok || !right_ok) {
        // Not a whole word: the text stays ordinary and the search moves on
        // past it, as the reference matcher's iterator does.
        pos = stop;
        continue;
      }
    }
    if (token.lstrip) start = SkipWhiteSpaceBackward(text, start, emitted);
    if (token.rstrip) stop = SkipWhiteSpaceForward(text, stop);
    if (start > emitted) out->push_back({text.substr(emitted, start - emitted), -1});
    out->push_back({text.substr(start, stop - start), best});
    emitted = stop;
    pos = stop;
  }
  if (emitted < text.size()) out->push_back({text.substr(emitted), -1});
}

}  // namespace tessera::tokenizer
