#include "text/tokenizer/utf8.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace tessera::tokenizer {
namespace {

// Result of looking at the sequence that starts at some position.
struct SequenceScan {
  // Bytes that belong to the sequence examined (>= 1).
  int length;
  // True when those bytes form one valid code point.
  bool valid;
  // True when the input ended before the sequence could complete, and every
  // byte seen so far is a valid prefix.
  bool truncated;
};

// Implements Unicode's "maximal subpart" rule (Table 3-7 of the standard).
SequenceScan ScanSequence(const uint8_t* p, size_t avail) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {1, true, false};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};  // Continuation byte or never-valid lead byte.
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= avail) return {i, false, true};
    const uint8_t b = p[i];
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return {i, false, false};
  }
  return {need + 1, true, false};
}

}  // namespace

absl::Status ValidateUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const SequenceScan scan = ScanSequence(p + i, text.size() - i);
    if (!scan.valid) {
      return absl::InvalidArgumentError(
          absl::StrFormat("text is not valid UTF-8: %s sequence at byte offset %d (byte 0x%02X)",
                          scan.truncated ? "truncated" : "ill-formed", i, p[i]));
    }
    i += scan.length;
  }
  return absl::OkStatus();
}

char32_t DecodeUtf8At(std::string_view text, size_t pos, int* len) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    *len = 2;
    return (char32_t{b0 & 0x1Fu} << 6) | (p[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    *len = 3;
    return (char32_t{b0 & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3F);
  }
  *len = 4;
  return (char32_t{b0 & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3F);
}

char32_t DecodeUtf8Next(std::string_view text, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + *pos;
  const SequenceScan scan = ScanSequence(p, text.size() - *pos);
  if (!scan.valid) {
    *pos += static_cast<size_t>(scan.length);
    return kReplacementChar;
  }
  int len = 0;
  const char32_t cp = DecodeUtf8At(text, *pos, &len);
  *pos += static_cast<size_t>(len);
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  size_t run_start = 0;  // Start of the pending run of valid bytes.
  while (i < bytes.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const SequenceScan scan = ScanSequence(p + i, bytes.size() - i);
    if (scan.valid) {
      i += scan.length;
      continue;
    }
    out->append(bytes.data() + run_start, i - run_start);
    if (scan.truncated && !final) return i;  // Wait for more bytes.
    out->append(kReplacementUtf8);
    i += scan.length;
    run_start = i;
  }
  out->append(bytes.data() + run_start, i - run_start);
  return i;
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendUtf8Lossy(bytes, /*final=*/true, &out);
  return out;
}

}  // namespace tessera::tokenizer
