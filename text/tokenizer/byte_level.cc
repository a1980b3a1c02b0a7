#include "text/tokenizer/byte_level.h"

#include "text/tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> to_unicode;
  // Indexed by code point; code points above U+0143 are never in the alphabet.
  std::array<int16_t, 0x144> to_byte;
  // UTF-8 spelling of every byte, for fast BytesToByteLevel.
  std::array<std::string, 256> spelled;
};

bool IsSelfMapped(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

const Tables& GetTables() {
  static const Tables* const tables = [] {
    auto* t = new Tables;
    t->to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = IsSelfMapped(b) ? static_cast<char32_t>(b) : next++;
      t->to_unicode[b] = cp;
      t->to_byte[cp] = static_cast<int16_t>(b);
      AppendUtf8(cp, &t->spelled[b]);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

char32_t ByteToUnicode(uint8_t b) { return GetTables().to_unicode[b]; }

int UnicodeToByte(char32_t cp) {
  const Tables& t = GetTables();
  return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.spelled[b];
  return out;
}

bool ByteLevelToBytes(std::string_view token, std::string* bytes) {
  bytes->clear();
  if (!ValidateUtf8(token).ok()) return false;
  size_t pos = 0;
  while (pos < token.size()) {
    int len = 0;
    const int b = UnicodeToByte(DecodeUtf8At(token, pos, &len));
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    pos += len;
  }
  return true;
}

}  // namespace tessera::tokenizer
