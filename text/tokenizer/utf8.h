// UTF-8 helpers for the tokenizer and the Jinja interpreter (its own small
// library, tessera_utf8): validation with the offending byte
// offset, code point decoding/encoding, and lossy decoding that replaces each
// maximal ill-formed subpart with U+FFFD (the policy of the WHATWG decoder,
// Rust's String::from_utf8_lossy and so of Hugging Face tokenizers).
//
// Thread-safety: all functions are pure and safe to call concurrently.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tessera::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Returns OK when `text` is well-formed UTF-8 (no overlongs, surrogates or
// code points above U+10FFFF); otherwise INVALID_ARGUMENT naming the byte
// offset and value of the first ill-formed sequence.
absl::Status ValidateUtf8(std::string_view text);

// Decodes the code point that starts at text[pos] and stores its length in
// *len. REQUIRES: `text` is valid UTF-8 and pos < text.size().
char32_t DecodeUtf8At(std::string_view text, size_t pos, int* len);

// Decodes the code point at text[*pos] and advances *pos past it. Total on
// any input: an ill-formed or truncated sequence decodes as U+FFFD and *pos
// skips its maximal subpart (as AppendUtf8Lossy replaces it). The Jinja
// interpreter walks its strings with it. REQUIRES: *pos < text.size().
char32_t DecodeUtf8Next(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `cp`. REQUIRES: cp is a Unicode scalar value.
void AppendUtf8(char32_t cp, std::string* out);

// Decodes `bytes` into `out`, replacing each maximal ill-formed subpart with
// U+FFFD. When `final` is false, a trailing sequence that is incomplete but
// could still become valid is left unconsumed. Returns the number of bytes
// consumed from `bytes`.
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

// Whole-buffer form of AppendUtf8Lossy(bytes, /*final=*/true, ...).
std::string ReplaceInvalidUtf8(std::string_view bytes);

}  // namespace tessera::tokenizer
