#include "text/tokenizer/unicode.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera::tokenizer {
namespace {

TEST(NfcTest, ComposesBaseAndCombiningMark) {
  EXPECT_EQ(NormalizeNfc("e\u0301"), "\u00e9");
  EXPECT_EQ(NormalizeNfc("Cafe\u0301 au lait"), "Caf\u00e9 au lait");
  EXPECT_EQ(NormalizeNfc("A\u030a"), "\u00c5");
}

TEST(NfcTest, ReplacesSingletonsWithTheirCanonicalEquivalent) {
  EXPECT_EQ(NormalizeNfc("\u212b"), "\u00c5");  // ANGSTROM SIGN
  EXPECT_EQ(NormalizeNfc("\u2126"), "\u03a9");  // OHM SIGN
  EXPECT_EQ(NormalizeNfc("\u212a"), "K");       // KELVIN SIGN
  EXPECT_EQ(NormalizeNfc("\uf900"), "\u8c48");  // CJK COMPATIBILITY IDEOGRAPH
}

TEST(NfcTest, OrdersMarksByCombiningClassBeforeComposing) {
  // a + dot below (220) + circumflex (230) and the reverse order both give
  // U+1EAD, since canonical ordering puts the dot below first.
  EXPECT_EQ(NormalizeNfc("a\u0323\u0302"), "\u1ead");
  EXPECT_EQ(NormalizeNfc("a\u0302\u0323"), "\u1ead");
  // Marks of equal class keep their order: these two stay apart.
  EXPECT_EQ(NormalizeNfc("a\u0301\u0300"), "\u00e1\u0300");
}

TEST(NfcTest, LeavesCompositionExclusionsDecomposed) {
  // DEVANAGARI LETTER QA decomposes to KA + NUKTA and is never recomposed.
  EXPECT_EQ(NormalizeNfc("\u0958"), "\u0915\u093c");
  EXPECT_EQ(NormalizeNfc("\u0915\u093c"), "\u0915\u093c");
  // COMBINING GREEK DIALYTIKA TONOS becomes two marks.
  EXPECT_EQ(NormalizeNfc("\u0344"), "\u0308\u0301");
}

TEST(NfcTest, ComposesHangulJamoAlgorithmically) {
  EXPECT_EQ(NormalizeNfc("\u1100\u1161"), "\uac00");        // GA
  EXPECT_EQ(NormalizeNfc("\u1100\u1161\u11a8"), "\uac01");  // GAG
  EXPECT_EQ(NormalizeNfc("\uac00\u11a8"), "\uac01");
  EXPECT_EQ(NormalizeNfc("\u1112\u1161\u11ab\u1100\u1173\u11af"), "\ud55c\uae00");
}

TEST(NfcTest, LeadingCombiningMarkStaysAndIsIdempotent) {
  EXPECT_EQ(NormalizeNfc("\u0301e"), "\u0301e");
  const std::string inputs[] = {"e\u0301\u0323x", "\u1e9b\u0323", "o\u0308\u0304",
                                "Vie\u0323\u0302t", "\u05e9\u05c1\u05bc"};
  for (const std::string& s : inputs) {
    const std::string once = NormalizeNfc(s);
    EXPECT_EQ(NormalizeNfc(once), once);
  }
}

TEST(NfcTest, QuickCheckAcceptsCommonTextAndFlagsCandidates) {
  EXPECT_TRUE(IsNfcQuick("plain ASCII text"));
  EXPECT_TRUE(IsNfcQuick("你好，世界 한국어 Ελληνικά русский"));
  EXPECT_TRUE(IsNfcQuick("caf\u00e9"));
  EXPECT_FALSE(IsNfcQuick("cafe\u0301"));     // Combining acute may compose.
  EXPECT_FALSE(IsNfcQuick("\u212b"));         // Never appears in NFC.
  EXPECT_FALSE(IsNfcQuick("a\u0302\u0323"));  // Marks out of order.
}

TEST(UnicodeTest, WhiteSpaceIsTheUnicodeProperty) {
  for (char32_t cp :
       {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00a0', U'\u1680', U'\u2000',
        U'\u200a', U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'}) {
    EXPECT_TRUE(IsWhiteSpace(cp)) << std::hex << static_cast<uint32_t>(cp);
  }
  for (char32_t cp : {U'a', U'\u180e', U'\u200b', U'\ufeff', U'\u001c', U'\u00ad'}) {
    EXPECT_FALSE(IsWhiteSpace(cp)) << std::hex << static_cast<uint32_t>(cp);
  }
}

TEST(UnicodeTest, CombiningClasses) {
  EXPECT_EQ(CanonicalCombiningClass('a'), 0);
  EXPECT_EQ(CanonicalCombiningClass(0x301), 230);
  EXPECT_EQ(CanonicalCombiningClass(0x323), 220);
  EXPECT_EQ(CanonicalCombiningClass(0x93c), 7);
  EXPECT_FALSE(UnicodeTablesVersion().empty());
}

}  // namespace
}  // namespace tessera::tokenizer
