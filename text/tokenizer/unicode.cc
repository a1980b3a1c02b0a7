#include "text/tokenizer/unicode.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "text/tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

struct CccRange {
  char32_t first;
  char32_t last;
  uint8_t ccc;
};
struct DecompEntry {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct CompositionEntry {
  char32_t first;
  char32_t second;
  char32_t composite;
};
struct CodePointRange {
  char32_t first;
  char32_t last;
};

#include "text/tokenizer/unicode_tables.inc"

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28;
constexpr int kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <typename Range, size_t N>
const Range* FindRange(const Range (&table)[N], char32_t cp) {
  const Range* it = std::upper_bound(std::begin(table), std::end(table), cp,
                                     [](char32_t c, const Range& r) { return c < r.first; });
  if (it == std::begin(table)) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

bool InNotQuick(char32_t cp) {
  // Everything below U+0300 is NFC-stable and not composable with a predecessor.
  return cp >= 0x300 && FindRange(kNfcNotQuick, cp) != nullptr;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const DecompEntry* it =
        std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                         [](const DecompEntry& e, char32_t c) { return e.cp < c; });
    if (it != std::end(kDecompositions) && it->cp == cp) {
      out->insert(out->end(), kDecompositionPool + it->offset,
                  kDecompositionPool + it->offset + it->length);
      return;
    }
  }
  out->push_back(cp);
}

// Returns the primary composite of <first, second>, or 0 when there is none.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const CompositionEntry* it = std::lower_bound(
      std::begin(kCompositions), std::end(kCompositions), std::make_pair(first, second),
      [](const CompositionEntry& e, const std::pair<char32_t, char32_t>& key) {
        return e.first != key.first ? e.first < key.first : e.second < key.second;
      });
  if (it != std::end(kCompositions) && it->first == first && it->second == second) {
    return it->composite;
  }
  return 0;
}

}  // namespace

std::string_view UnicodeTablesVersion() { return kUnicodeVersion; }

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return FindRange(kWhiteSpace, cp) != nullptr;
}

int CanonicalCombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const CccRange* r = FindRange(kCccRanges, cp);
  return r == nullptr ? 0 : r->ccc;
}

bool IsNfcQuick(std::string_view text) {
  int last_ccc = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      last_ccc = 0;
      ++pos;
      continue;
    }
    int len = 0;
    const char32_t cp = DecodeUtf8At(text, pos, &len);
    pos += len;
    if (cp < 0x300) {
      last_ccc = 0;
      continue;
    }
    const int ccc = CanonicalCombiningClass(cp);
    if (ccc != 0 && last_ccc > ccc) return false;
    if (InNotQuick(cp)) return false;
    last_ccc = ccc;
  }
  return true;
}

std::string NormalizeNfc(std::string_view text) {
  if (IsNfcQuick(text)) return std::string(text);

  // 1. Full canonical decomposition.
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    int len = 0;
    Decompose(DecodeUtf8At(text, pos, &len), &cps);
    pos += len;
  }

  // 2. Canonical ordering: stable sort of every run of non-starters.
  std::vector<int> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = CanonicalCombiningClass(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < cps.size() && ccc[end] != 0) ++end;
    // Insertion sort: runs are short and the sort must be stable.
    for (size_t a = i + 1; a < end; ++a) {
      const char32_t c = cps[a];
      const int k = ccc[a];
      size_t b = a;
      while (b > i && ccc[b - 1] > k) {
        cps[b] = cps[b - 1];
        ccc[b] = ccc[b - 1];
        --b;
      }
      cps[b] = c;
      ccc[b] = k;
    }
    i = end;
  }

  // 3. Canonical composition.
  size_t out = 0;
  if (!cps.empty()) {
    size_t starter = 0;
    bool have_starter = ccc[0] == 0;  // Nothing composes onto a leading non-starter.
    int last_class = ccc[0];
    out = 1;
    for (size_t i = 1; i < cps.size(); ++i) {
      const char32_t c = cps[i];
      const int k = ccc[i];
      // <starter, c> may compose when nothing between them blocks c: either
      // c is adjacent to the starter, or every mark in between has a lower class.
      if (have_starter && (last_class == 0 || last_class < k)) {
        const char32_t composite = Compose(cps[starter], c);
        if (composite != 0) {
          cps[starter] = composite;
          continue;
        }
      }
      if (k == 0) {
        starter = out;
        have_starter = true;
      }
      last_class = k;
      cps[out] = c;
      ccc[out] = k;
      ++out;
    }
  }

  std::string result;
  result.reserve(text.size());
  for (size_t i = 0; i < out; ++i) AppendUtf8(cps[i], &result);
  return result;
}

}  // namespace tessera::tokenizer
