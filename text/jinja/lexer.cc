#include "text/jinja/lexer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "text/jinja/js_string.h"

namespace tessera::text::jinja {
namespace {

// Preprocessed source: text plus, for each byte, its offset in the original.
struct Mapped {
  std::string text;
  std::vector<int32_t> origin;

  void Push(char c, int32_t from) {
    text.push_back(c);
    origin.push_back(from);
  }
  void Truncate(size_t n) {
    text.resize(n);
    origin.resize(n);
  }
};

bool IsLineStart(const Mapped& m, size_t i) {
  if (i == 0) return true;
  const char prev = m.text[i - 1];
  if (prev == '\n' || prev == '\r') return true;
  // U+2028 / U+2029 (E2 80 A8 / E2 80 A9) end a line for JavaScript's ^.
  return i >= 3 && static_cast<unsigned char>(m.text[i - 3]) == 0xE2 &&
         static_cast<unsigned char>(m.text[i - 2]) == 0x80 &&
         (static_cast<unsigned char>(prev) == 0xA8 || static_cast<unsigned char>(prev) == 0xA9);
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1".
Mapped LstripBlocks(const Mapped& in) {
  Mapped out;
  size_t i = 0;
  while (i < in.text.size()) {
    if (IsLineStart(in, i)) {
      size_t j = i;
      while (j < in.text.size() && (in.text[j] == ' ' || in.text[j] == '\t')) ++j;
      if (j + 1 < in.text.size() && in.text[j] == '{' &&
          (in.text[j + 1] == '#' || in.text[j + 1] == '%' || in.text[j + 1] == '-')) {
        out.Push(in.text[j], in.origin[j]);
        out.Push(in.text[j + 1], in.origin[j + 1]);
        i = j + 2;
        continue;
      }
    }
    out.Push(in.text[i], in.origin[i]);
    ++i;
  }
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
Mapped TrimBlocks(const Mapped& in) {
  Mapped out;
  size_t i = 0;
  const std::string& s = in.text;
  while (i < s.size()) {
    if (i + 2 < s.size() && (s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' &&
        s[i + 2] == '\n') {
      out.Push(s[i], in.origin[i]);
      out.Push(s[i + 1], in.origin[i + 1]);
      i += 3;
      continue;
    }
    out.Push(s[i], in.origin[i]);
    ++i;
  }
  return out;
}

// Length of a whitespace code point at s[i], 0 if none.
size_t WhitespaceAt(absl::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t next = i;
  return IsJsWhitespace(DecodeUtf8Next(s, &next)) ? next - i : 0;
}

// If a `{% generation %}` / `{% endgeneration %}` tag (optionally with `-`)
// starts at s[i], returns its end and whether it strips either side.
bool MatchGenerationTag(absl::string_view s, size_t i, size_t* end, bool* lstrip, bool* rstrip) {
  if (!absl::StartsWith(s.substr(i), "{%")) return false;
  size_t j = i + 2;
  *lstrip = j < s.size() && s[j] == '-';
  if (*lstrip) ++j;
  while (size_t w = WhitespaceAt(s, j)) j += w;
  if (absl::StartsWith(s.substr(j), "end")) j += 3;
  if (!absl::StartsWith(s.substr(j), "generation")) return false;
  j += 10;
  while (size_t w = WhitespaceAt(s, j)) j += w;
  *rstrip = j < s.size() && s[j] == '-';
  if (*rstrip) ++j;
  if (!absl::StartsWith(s.substr(j), "%}")) return false;
  *end = j + 2;
  return true;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/g -> before/after kept
// unless the tag strips that side.
Mapped RemoveGenerationTags(const Mapped& in) {
  Mapped out;
  const absl::string_view s = in.text;
  size_t i = 0;
  size_t ws_run_out = 0;  // output length where the current whitespace run began
  bool in_ws_run = false;
  while (i < s.size()) {
    size_t end = 0;
    bool lstrip = false;
    bool rstrip = false;
    if (s[i] == '{' && MatchGenerationTag(s, i, &end, &lstrip, &rstrip)) {
      if (lstrip && in_ws_run) out.Truncate(ws_run_out);
      i = end;
      const size_t after_start = i;
      while (size_t w = WhitespaceAt(s, i)) i += w;
      if (!rstrip) {
        for (size_t k = after_start; k < i; ++k) out.Push(s[k], in.origin[k]);
      }
      in_ws_run = false;
      continue;
    }
    if (size_t w = WhitespaceAt(s, i)) {
      if (!in_ws_run) {
        in_ws_run = true;
        ws_run_out = out.text.size();
      }
      for (size_t k = 0; k < w; ++k) out.Push(s[i + k], in.origin[i + k]);
      i += w;
      continue;
    }
    in_ws_run = false;
    out.Push(s[i], in.origin[i]);
    ++i;
  }
  return out;
}

Mapped Preprocess(absl::string_view source, const LexOptions& options) {
  Mapped m;
  m.text.assign(source.data(), source.size());
  m.origin.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) m.origin[i] = static_cast<int32_t>(i);
  if (!m.text.empty() && m.text.back() == '\n') m.Truncate(m.text.size() - 1);
  if (options.lstrip_blocks) m = LstripBlocks(m);
  if (options.trim_blocks) m = TrimBlocks(m);
  if (m.text.find("generation") != std::string::npos) m = RemoveGenerationTags(m);
  return m;
}

bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) {
  return IsDigitChar(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

struct TableEntry {
  const char* seq;
  TokenType type;
};
constexpr TableEntry kTable[] = {
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonBinaryOperator},
    {">=", TokenType::kComparisonBinaryOperator},
    {"==", TokenType::kComparisonBinaryOperator},
    {"!=", TokenType::kComparisonBinaryOperator},
    {"<", TokenType::kComparisonBinaryOperator},
    {">", TokenType::kComparisonBinaryOperator},
    {"+", TokenType::kAdditiveBinaryOperator},
    {"-", TokenType::kAdditiveBinaryOperator},
    {"~", TokenType::kAdditiveBinaryOperator},
    {"**", TokenType::kExponentiationBinaryOperator},
    {"*", TokenType::kMultiplicativeBinaryOperator},
    {"//", TokenType::kMultiplicativeBinaryOperator},
    {"/", TokenType::kMultiplicativeBinaryOperator},
    {"%", TokenType::kMultiplicativeBinaryOperator},
    {"=", TokenType::kEquals},
};

class Lexer {
 public:
  Lexer(absl::string_view original, Mapped src) : original_(original), src_(std::move(src)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    const std::string& s = src_.text;
    while (pos_ < s.size()) {
      const bool after_tag = tokens_.empty() || Last() == TokenType::kCloseStatement ||
                             Last() == TokenType::kCloseExpression || Last() == TokenType::kComment;
      if (after_tag) {
        const size_t start = pos_;
        while (pos_ < s.size() &&
               !(s[pos_] == '{' && pos_ + 1 < s.size() &&
                 (s[pos_ + 1] == '%' || s[pos_ + 1] == '{' || s[pos_ + 1] == '#'))) {
          ++pos_;
        }
        if (pos_ > start) {
          Push(TokenType::kText, s.substr(start, pos_ - start), start);
          continue;
        }
      }
      if (At("{#")) {
        const size_t start = pos_;
        pos_ += 2;
        const bool strip_before = pos_ < s.size() && s[pos_] == '-';
        if (strip_before) ++pos_;
        const size_t body = pos_;
        while (!(pos_ + 1 < s.size() && s[pos_] == '#' && s[pos_ + 1] == '}')) {
          if (pos_ + 2 >= s.size()) return Error(start, "Missing end of comment tag");
          ++pos_;
        }
        std::string comment = s.substr(body, pos_ - body);
        const bool strip_after = !comment.empty() && comment.back() == '-';
        if (strip_after) comment.pop_back();
        if (strip_before) StripTrailingWhitespace();
        Push(TokenType::kComment, std::move(comment), start);
        pos_ += 2;
        if (strip_after) SkipLeadingWhitespace();
        continue;
      }
      if (At("{%-")) {
        StripTrailingWhitespace();
        Push(TokenType::kOpenStatement, "{%", pos_);
        pos_ += 3;
        continue;
      }
      if (At("{{-")) {
        StripTrailingWhitespace();
        Push(TokenType::kOpenExpression, "{{", pos_);
        curly_depth_ = 0;
        pos_ += 3;
        continue;
      }
      // Whitespace inside a tag separates tokens.
      while (size_t w = WhitespaceAt(s, pos_)) {
        pos_ += w;
        if (pos_ >= s.size()) return Error(pos_ - 1, "Unexpected end of input");
      }
      if (At("-%}")) {
        Push(TokenType::kCloseStatement, "%}", pos_);
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      if (At("-}}")) {
        Push(TokenType::kCloseExpression, "}}", pos_);
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      const char c = s[pos_];
      if (c == '-' || c == '+') {
        if (tokens_.empty() || Last() == TokenType::kText) {
          return Error(pos_, absl::StrCat("Unexpected character: ", std::string(1, c)));
        }
        switch (Last()) {
          case TokenType::kIdentifier:
          case TokenType::kNumericLiteral:
          case TokenType::kStringLiteral:
          case TokenType::kCloseParen:
          case TokenType::kCloseSquareBracket:
            break;  // a binary operator
          default: {
            const size_t start = pos_;
            ++pos_;
            auto num = ConsumeDigits();
            if (!num.ok()) return num.status();
            std::string digits = *num;
            if (!digits.empty() && pos_ + 1 < s.size() && s[pos_] == '.' &&
                IsDigitChar(s[pos_ + 1])) {
              ++pos_;
              auto frac = ConsumeDigits();
              if (!frac.ok()) return frac.status();
              digits = absl::StrCat(digits, ".", *frac);
            }
            if (digits.empty()) {
              Push(TokenType::kUnaryOperator, std::string(1, c), start);
            } else {
              Push(TokenType::kNumericLiteral, absl::StrCat(std::string(1, c), digits), start);
            }
            continue;
          }
        }
      }
      bool matched = false;
      for (const TableEntry& e : kTable) {
        const absl::string_view seq(e.seq);
        if (seq == "}}" && curly_depth_ > 0) continue;
        if (!At(seq)) continue;
        Push(e.type, std::string(seq), pos_);
        if (e.type == TokenType::kOpenExpression) {
          curly_depth_ = 0;
        } else if (e.type == TokenType::kOpenCurlyBracket) {
          ++curly_depth_;
        } else if (e.type == TokenType::kCloseCurlyBracket) {
          --curly_depth_;
        }
        pos_ += seq.size();
        matched = true;
        break;
      }
      if (matched) continue;
      if (c == '\'' || c == '"') {
        const size_t start = pos_;
        ++pos_;
        auto str = ConsumeString(c);
        if (!str.ok()) return str.status();
        Push(TokenType::kStringLiteral, *std::move(str), start);
        ++pos_;
        continue;
      }
      if (IsDigitChar(c)) {
        const size_t start = pos_;
        auto num = ConsumeDigits();
        if (!num.ok()) return num.status();
        std::string digits = *num;
        if (Last() != TokenType::kDot && pos_ + 1 < s.size() && s[pos_] == '.' &&
            IsDigitChar(s[pos_ + 1])) {
          ++pos_;
          auto frac = ConsumeDigits();
          if (!frac.ok()) return frac.status();
          digits = absl::StrCat(digits, ".", *frac);
        }
        Push(TokenType::kNumericLiteral, std::move(digits), start);
        continue;
      }
      if (IsWordChar(c)) {
        const size_t start = pos_;
        while (IsWordChar(s[pos_])) {
          ++pos_;
          if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
        }
        Push(TokenType::kIdentifier, s.substr(start, pos_ - start), start);
        continue;
      }
      size_t next = pos_;
      std::string ch;
      AppendUtf8(DecodeUtf8Next(s, &next), &ch);
      return Error(pos_, absl::StrCat("Unexpected character: ", ch));
    }
    return std::move(tokens_);
  }

 private:
  TokenType Last() const { return tokens_.empty() ? TokenType::kText : tokens_.back().type; }
  bool At(absl::string_view seq) const {
    return absl::StartsWith(absl::string_view(src_.text).substr(pos_), seq);
  }
  int32_t Origin(size_t at) const {
    if (src_.origin.empty()) return 0;
    return at < src_.origin.size() ? src_.origin[at] : src_.origin.back() + 1;
  }
  void Push(TokenType type, std::string value, size_t at) {
    tokens_.push_back(Token{type, std::move(value), Origin(at)});
  }
  absl::Status Error(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "template syntax error at ", DescribePosition(original_, Origin(at)), ": ", what));
  }
  void StripTrailingWhitespace() {
    if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
    std::string& v = tokens_.back().value;
    v.resize(JsTrimEnd(v).size());
    if (v.empty()) tokens_.pop_back();
  }
  void SkipLeadingWhitespace() {
    while (size_t w = WhitespaceAt(src_.text, pos_)) pos_ += w;
  }
  absl::StatusOr<std::string> ConsumeDigits() {
    const std::string& s = src_.text;
    const size_t start = pos_;
    while (pos_ < s.size() && IsDigitChar(s[pos_])) {
      ++pos_;
      if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
    }
    return s.substr(start, pos_ - start);
  }
  absl::StatusOr<uint32_t> Hex(size_t len) {
    const std::string& s = src_.text;
    if (pos_ + len > s.size()) return Error(pos_, "Invalid hexadecimal escape sequence");
    uint32_t v = 0;
    for (size_t k = 0; k < len; ++k) {
      const char h = s[pos_ + k];
      int d = -1;
      if (IsDigitChar(h)) d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) return Error(pos_, "Invalid hexadecimal escape sequence");
      v = v * 16 + d;
    }
    pos_ += len;
    return v;
  }
  absl::StatusOr<std::string> ConsumeString(char quote) {
    const std::string& s = src_.text;
    const size_t start = pos_;
    std::string out;
    if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
    while (s[pos_] != quote) {
      if (s[pos_] == '\\') {
        ++pos_;
        if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
        const char e = s[pos_++];
        if (e == 'x' || e == 'u') {
          auto cp = Hex(e == 'x' ? 2 : 4);
          if (!cp.ok()) return cp.status();
          uint32_t v = *cp;
          if (v >= 0xD800 && v <= 0xDBFF && At("\\u")) {
            pos_ += 2;
            auto low = Hex(4);
            if (!low.ok()) return low.status();
            if (*low < 0xDC00 || *low > 0xDFFF) {
              return Error(start, "unpaired surrogate escape in a string literal (not supported)");
            }
            v = 0x10000 + ((v - 0xD800) << 10) + (*low - 0xDC00);
          } else if (v >= 0xD800 && v <= 0xDFFF) {
            return Error(start, "unpaired surrogate escape in a string literal (not supported)");
          }
          AppendUtf8(v, &out);
        } else {
          switch (e) {
            case 'n':
              out.push_back('\n');
              break;
            case 't':
              out.push_back('\t');
              break;
            case 'r':
              out.push_back('\r');
              break;
            case 'b':
              out.push_back('\b');
              break;
            case 'f':
              out.push_back('\f');
              break;
            case 'v':
              out.push_back('\v');
              break;
            case '\'':
              out.push_back('\'');
              break;
            case '"':
              out.push_back('"');
              break;
            case '\\':
              out.push_back('\\');
              break;
            default:
              return Error(pos_ - 1,
                           absl::StrCat("Unexpected escaped character: ", std::string(1, e)));
          }
        }
        if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
        continue;
      }
      out.push_back(s[pos_++]);
      if (pos_ >= s.size()) return Error(start, "Unexpected end of input");
    }
    return out;
  }

  absl::string_view original_;
  Mapped src_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

absl::string_view TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "Text";
    case TokenType::kNumericLiteral:
      return "NumericLiteral";
    case TokenType::kStringLiteral:
      return "StringLiteral";
    case TokenType::kIdentifier:
      return "Identifier";
    case TokenType::kEquals:
      return "Equals";
    case TokenType::kOpenParen:
      return "OpenParen";
    case TokenType::kCloseParen:
      return "CloseParen";
    case TokenType::kOpenStatement:
      return "OpenStatement";
    case TokenType::kCloseStatement:
      return "CloseStatement";
    case TokenType::kOpenExpression:
      return "OpenExpression";
    case TokenType::kCloseExpression:
      return "CloseExpression";
    case TokenType::kOpenSquareBracket:
      return "OpenSquareBracket";
    case TokenType::kCloseSquareBracket:
      return "CloseSquareBracket";
    case TokenType::kOpenCurlyBracket:
      return "OpenCurlyBracket";
    case TokenType::kCloseCurlyBracket:
      return "CloseCurlyBracket";
    case TokenType::kComma:
      return "Comma";
    case TokenType::kDot:
      return "Dot";
    case TokenType::kColon:
      return "Colon";
    case TokenType::kPipe:
      return "Pipe";
    case TokenType::kAdditiveBinaryOperator:
      return "AdditiveBinaryOperator";
    case TokenType::kMultiplicativeBinaryOperator:
      return "MultiplicativeBinaryOperator";
    case TokenType::kExponentiationBinaryOperator:
      return "ExponentiationBinaryOperator";
    case TokenType::kComparisonBinaryOperator:
      return "ComparisonBinaryOperator";
    case TokenType::kUnaryOperator:
      return "UnaryOperator";
    case TokenType::kComment:
      return "Comment";
  }
  return "?";
}

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source, const LexOptions& options) {
  if (source.size() > static_cast<size_t>(INT32_MAX / 2)) {
    return absl::InvalidArgumentError("template source is too large");
  }
  Lexer lexer(source, Preprocess(source, options));
  return lexer.Run();
}

std::string DescribePosition(absl::string_view source, int32_t offset) {
  int line = 1;
  int column = 1;
  const size_t end = std::min<size_t>(offset < 0 ? 0 : offset, source.size());
  size_t pos = 0;
  while (pos < end) {
    const char32_t cp = DecodeUtf8Next(source, &pos);
    if (cp == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return absl::StrCat("line ", line, ", column ", column);
}

}  // namespace tessera::text::jinja
