#include "text/tokenizer/byte_level.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "text/tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

TEST(ByteLevelTest, MappingIsABijectionOntoPrintableCodePoints) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second) << "byte " << b << " collides";
    EXPECT_EQ(UnicodeToByte(cp), b);
    // Never a control character, space, or soft hyphen.
    EXPECT_GT(cp, 0x20u);
    EXPECT_FALSE(cp >= 0x7F && cp <= 0xA0);
    EXPECT_NE(cp, 0xADu);
  }
  EXPECT_EQ(seen.size(), 256u);
}

TEST(ByteLevelTest, PrintableLatin1StandsForItselfOthersShiftPast255) {
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    if (printable) {
      EXPECT_EQ(cp, static_cast<char32_t>(b));
    } else {
      EXPECT_GE(cp, 256u);
      EXPECT_LT(cp, 256u + 68u);
    }
  }
  // The non-printable bytes are numbered in increasing byte order: 0x00..0x20
  // take U+0100..U+0120, so space is U+0120 'Ġ' and newline U+010A 'Ċ'.
  EXPECT_EQ(ByteToUnicode(0x00), 0x100u);
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);
  EXPECT_EQ(BytesToByteLevel(" hello\n"),
            "Ġhello"
            "Ċ");
}

TEST(ByteLevelTest, RoundTripsAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = BytesToByteLevel(all);
  EXPECT_TRUE(ValidateUtf8(spelled).ok());
  std::string back;
  ASSERT_TRUE(ByteLevelToBytes(spelled, &back));
  EXPECT_EQ(back, all);
  // UTF-8 of "é" is C3 A9, spelled "Ã©".
  EXPECT_EQ(BytesToByteLevel("é"), "Ã©");
}

TEST(ByteLevelTest, RejectsCodePointsOutsideTheAlphabet) {
  std::string bytes;
  EXPECT_FALSE(ByteLevelToBytes(" ", &bytes));  // Space is spelled Ġ.
  EXPECT_FALSE(ByteLevelToBytes("你", &bytes));
  EXPECT_FALSE(ByteLevelToBytes("\xC3", &bytes));  // Not UTF-8.
  EXPECT_EQ(UnicodeToByte(0x144), -1);
  EXPECT_EQ(UnicodeToByte(0x10FFFF), -1);
}

}  // namespace
}  // namespace tessera::tokenizer
