#include "text/jinja/js_string.h"

#include <locale.h>
#include <wctype.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera::text::jinja {

bool IsJsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

absl::string_view JsTrimStart(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsJsWhitespace(DecodeUtf8Next(s, &next))) break;
    pos = next;
  }
  return s.substr(pos);
}

absl::string_view JsTrimEnd(absl::string_view s) {
  // Walk forward, remembering where the last non-whitespace code point ends.
  size_t pos = 0;
  size_t end = 0;
  while (pos < s.size()) {
    if (!IsJsWhitespace(DecodeUtf8Next(s, &pos))) end = pos;
  }
  return s.substr(0, end);
}

absl::string_view JsTrim(absl::string_view s) { return JsTrimEnd(JsTrimStart(s)); }

int64_t Utf16Length(absl::string_view s) {
  int64_t n = 0;
  size_t pos = 0;
  while (pos < s.size()) n += DecodeUtf8Next(s, &pos) >= 0x10000 ? 2 : 1;
  return n;
}

int64_t CodePointCount(absl::string_view s) {
  int64_t n = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    DecodeUtf8Next(s, &pos);
    ++n;
  }
  return n;
}

std::string JsNumberToString(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";
  std::string out = d < 0 ? "-" : "";
  d = std::fabs(d);
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  absl::string_view sci(buf, res.ptr - buf);  // "d.ddde+XX" or "de-XX"
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int n = exp10 + 1;
  const int k = static_cast<int>(digits.size());
  if (k <= n && n <= 21) {
    out += digits;
    out.append(n - k, '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, n);
    out += ".";
    out += digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out += "0.";
    out.append(-n, '0');
    out += digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppend(&out, "e", n - 1 >= 0 ? "+" : "-", std::abs(n - 1));
  }
  return out;
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8Next(s, &pos);
    switch (cp) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned>(cp));
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        absl::StrAppendFormat(out, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                              static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned>(cp));
      }
    } else {
      AppendUtf8(cp, out);
    }
  }
  out->push_back('"');
}

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Length of the longest StrDecimalLiteral prefix of s (without sign), 0 if
// none. Sets *infinity when the prefix is "Infinity".
size_t DecimalPrefix(absl::string_view s, bool* infinity) {
  *infinity = false;
  if (absl::StartsWith(s, "Infinity")) {
    *infinity = true;
    return 8;
  }
  size_t i = 0;
  size_t mantissa_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    size_t frac = 0;
    while (j < s.size() && IsDigit(s[j])) ++j, ++frac;
    if (mantissa_digits + frac > 0) {
      i = j;
      mantissa_digits += frac;
    }
  }
  if (mantissa_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    size_t exp_digits = 0;
    while (j < s.size() && IsDigit(s[j])) ++j, ++exp_digits;
    if (exp_digits > 0) i = j;
  }
  return i;
}

double ParseDecimal(absl::string_view digits) {
  std::string copy(digits);
  return std::strtod(copy.c_str(), nullptr);
}

}  // namespace

std::optional<double> JsParseInt(absl::string_view s) {
  s = JsTrimStart(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  size_t n = 0;
  while (n < s.size() && IsDigit(s[n])) ++n;
  if (n == 0) return std::nullopt;
  const double v = ParseDecimal(s.substr(0, n));
  return negative ? -v : v;
}

std::optional<double> JsParseFloat(absl::string_view s) {
  s = JsTrimStart(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  bool infinity = false;
  const size_t n = DecimalPrefix(s, &infinity);
  if (n == 0) return std::nullopt;
  const double v = infinity ? INFINITY : ParseDecimal(s.substr(0, n));
  return negative ? -v : v;
}

double JsStringToNumber(absl::string_view s) {
  s = JsTrim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    if (s[1] == 'x' || s[1] == 'X') base = 16;
    if (s[1] == 'o' || s[1] == 'O') base = 8;
    if (s[1] == 'b' || s[1] == 'B') base = 2;
    if (base != 0) {
      double v = 0;
      for (char c : s.substr(2)) {
        int digit = -1;
        if (IsDigit(c)) digit = c - '0';
        if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
        if (digit < 0 || digit >= base) return NAN;
        v = v * base + digit;
      }
      return v;
    }
  }
  bool negative = false;
  absl::string_view body = s;
  if (body[0] == '+' || body[0] == '-') {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  bool infinity = false;
  const size_t n = DecimalPrefix(body, &infinity);
  if (n == 0 || n != body.size()) return NAN;
  const double v = infinity ? INFINITY : ParseDecimal(body);
  return negative ? -v : v;
}

namespace {

locale_t Utf8Locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return loc;
}

// Characters whose JavaScript case mapping is not the simple one-to-one
// mapping (SpecialCasing.txt, plus context-dependent final sigma).
bool HasSpecialUpper(char32_t cp) {
  return cp == 0xDF || cp == 0x149 || cp == 0x1F0 || cp == 0x390 || cp == 0x3B0 || cp == 0x587 ||
         (cp >= 0x1E96 && cp <= 0x1E9A) || (cp >= 0x1F50 && cp <= 0x1F56) ||
         (cp >= 0x1F80 && cp <= 0x1FFF) || (cp >= 0xFB00 && cp <= 0xFB06) ||
         (cp >= 0xFB13 && cp <= 0xFB17) || cp == 0x345;
}
bool HasSpecialLower(char32_t cp) { return cp == 0x130 || cp == 0x3A3; }

absl::StatusOr<std::string> MapCase(absl::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = DecodeUtf8Next(s, &pos);
    if (cp < 0x80) {
      if (upper && cp >= 'a' && cp <= 'z') cp -= 32;
      if (!upper && cp >= 'A' && cp <= 'Z') cp += 32;
      out.push_back(static_cast<char>(cp));
      continue;
    }
    if (upper ? HasSpecialUpper(cp) : HasSpecialLower(cp)) {
      return absl::UnimplementedError(
          absl::StrFormat("%s of U+%04X is not supported (its mapping is not one to one)",
                          upper ? "upper-casing" : "lower-casing", static_cast<unsigned>(cp)));
    }
    locale_t loc = Utf8Locale();
    if (loc == static_cast<locale_t>(0)) {
      return absl::UnimplementedError(
          "changing the case of non-ASCII text needs the C.UTF-8 locale, which is missing");
    }
    const wint_t mapped =
        upper ? towupper_l(static_cast<wint_t>(cp), loc) : towlower_l(static_cast<wint_t>(cp), loc);
    AppendUtf8(static_cast<char32_t>(mapped), &out);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> JsToUpper(absl::string_view s) { return MapCase(s, true); }
absl::StatusOr<std::string> JsToLower(absl::string_view s) { return MapCase(s, false); }

}  // namespace tessera::text::jinja
