// Tokenizer of Jinja template source.
//
// Reproduces @huggingface/jinja's lexer, the reference this interpreter is
// tested against: the source is first preprocessed (one trailing newline
// dropped; lstrip_blocks and trim_blocks as transformers configures Jinja;
// transformers' `{% generation %}` markers removed), then split into text,
// comments and the tokens inside `{{ }}` and `{% %}`, honouring `-` on either
// side of a tag. Every token records its offset in the original source so
// that errors can name a line and column.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::text::jinja {

enum class TokenType : uint8_t {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditiveBinaryOperator,        // + - ~
  kMultiplicativeBinaryOperator,  // * / // %
  kExponentiationBinaryOperator,  // **
  kComparisonBinaryOperator,      // < > <= >= == !=
  kUnaryOperator,                 // a lone + or - before an operand
  kComment,
};

absl::string_view TokenTypeName(TokenType type);

struct Token {
  TokenType type;
  std::string value;
  int32_t offset;  // byte offset of the token in the original source
};

struct LexOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // drop spaces/tabs before a block tag on its line
};

// Errors are InvalidArgument naming the line and column.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source, const LexOptions& options);

// "line L, column C" (1-based, columns in code points) of a byte offset.
std::string DescribePosition(absl::string_view source, int32_t offset);

}  // namespace tessera::text::jinja
