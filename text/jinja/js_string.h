// JavaScript string and number semantics over UTF-8 text.
//
// The reference renderer of chat templates (@huggingface/jinja) runs on
// JavaScript strings and numbers. To render byte-identical text this
// interpreter reproduces the few JavaScript behaviours templates can observe:
// which code points are whitespace (String.prototype.trim, /\s/), how a
// number prints (Number.prototype.toString), how JSON.stringify escapes a
// string, parseInt/parseFloat prefixes, loose string-to-number conversion and
// the UTF-16 length of a string. Everything here works on UTF-8 std::string.
//
// Thread-safety: all functions are pure and safe to call concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/tokenizer/utf8.h"

namespace tessera::text::jinja {

// UTF-8 decoding and encoding are the tokenizer's (text/tokenizer/utf8.h):
// DecodeUtf8Next(s, &pos) decodes the code point at s[pos] and advances pos,
// U+FFFD for malformed bytes (the interpreter sees valid UTF-8 from JSON input
// and template source; that keeps it total); AppendUtf8(cp, &out).
// (This Abseil's string_view is not std::string_view, hence the wrapper.)
inline char32_t DecodeUtf8Next(absl::string_view s, size_t* pos) {
  return ::tessera::tokenizer::DecodeUtf8Next(std::string_view(s.data(), s.size()), pos);
}
using ::tessera::tokenizer::AppendUtf8;

// JavaScript's WhiteSpace + LineTerminator set (what /\s/ and trim() use).
bool IsJsWhitespace(char32_t cp);

// String.prototype.trim / trimStart / trimEnd.
absl::string_view JsTrim(absl::string_view s);
absl::string_view JsTrimStart(absl::string_view s);
absl::string_view JsTrimEnd(absl::string_view s);

// Length in UTF-16 code units (JavaScript's String.prototype.length).
int64_t Utf16Length(absl::string_view s);
// Number of code points.
int64_t CodePointCount(absl::string_view s);

// Number.prototype.toString() for a double (shortest round-trip digits,
// exponent form outside [1e-7, 1e21)).
std::string JsNumberToString(double d);

// JSON.stringify(string): quotes, escapes " \ and control characters.
// With ensure_ascii, code units >= 0x7f are written as \uxxxx (astral code
// points as two surrogate escapes), as @huggingface/jinja's tojson does.
void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out);

// parseInt(s, 10) and parseFloat(s); nullopt where JavaScript gives NaN.
std::optional<double> JsParseInt(absl::string_view s);
std::optional<double> JsParseFloat(absl::string_view s);

// ToNumber(string) as loose equality uses it; NaN when not numeric.
double JsStringToNumber(absl::string_view s);

// toUpperCase / toLowerCase. ASCII exactly; other cased letters through the
// C.UTF-8 locale's simple case mapping. Characters whose JavaScript mapping
// is not a simple one (e.g. U+00DF, ligatures, final sigma) are refused with
// an error rather than mapped differently.
absl::StatusOr<std::string> JsToUpper(absl::string_view s);
absl::StatusOr<std::string> JsToLower(absl::string_view s);

}  // namespace tessera::text::jinja
