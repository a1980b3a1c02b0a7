// Unicode data the tokenizer needs beyond what PCRE2 provides: NFC
// normalization (the "NFC" normalizer of Qwen tokenizers) and the
// White_Space property (stripping around added tokens, and the `\s` of
// pre-tokenizer patterns).
//
// NFC is implemented here, without ICU, from tables generated out of the
// Unicode Character Database by tools/gen_unicode_tables.py (see
// kUnicodeVersion in unicode_tables.inc). Characters assigned in later
// Unicode versions pass through unchanged.
//
// Thread-safety: all functions are pure and safe to call concurrently.
#pragma once

#include <string>
#include <string_view>

namespace tessera::tokenizer {

// Unicode version of the generated tables, e.g. "14.0.0".
std::string_view UnicodeTablesVersion();

// True when `cp` has the White_Space property.
bool IsWhiteSpace(char32_t cp);

// Canonical combining class of `cp` (0 for starters).
int CanonicalCombiningClass(char32_t cp);

// True when `text` is certainly in NFC already (the quick check of UAX #15
// answers Yes). A false answer means NormalizeNfc has to look closer.
// REQUIRES: `text` is valid UTF-8.
bool IsNfcQuick(std::string_view text);

// Returns the NFC form of `text`. REQUIRES: `text` is valid UTF-8.
std::string NormalizeNfc(std::string_view text);

}  // namespace tessera::tokenizer
