// The byte-level alphabet of GPT-2 style BPE (used by Qwen2/Qwen3 and
// Llama-3): every byte 0..255 is shown as one printable code point, so a
// vocabulary of UTF-8 strings can spell arbitrary bytes. Printable Latin-1
// bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves;
// the other 68 bytes map, in increasing order, to U+0100, U+0101, ...
// (so the space 0x20 becomes U+0120 'Ġ' and '\n' becomes U+010A 'Ċ').
//
// Thread-safety: all functions are pure; the tables are immutable after
// their thread-safe static initialization.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::tokenizer {

// Code point that represents byte `b`.
char32_t ByteToUnicode(uint8_t b);

// Byte represented by code point `cp`, or -1 when `cp` is outside the
// byte-level alphabet.
int UnicodeToByte(char32_t cp);

// Spells raw bytes in the byte-level alphabet (UTF-8 output).
std::string BytesToByteLevel(std::string_view bytes);

// Reverses BytesToByteLevel. Returns false, leaving *bytes unspecified, when
// `token` is not valid UTF-8 or holds a code point outside the alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* bytes);

}  // namespace tessera::tokenizer
