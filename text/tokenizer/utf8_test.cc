#include "text/tokenizer/utf8.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::tokenizer {
namespace {

using ::testing::HasSubstr;

std::string Fffd(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += kReplacementUtf8;
  return s;
}

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(ValidateUtf8("").ok());
  EXPECT_TRUE(ValidateUtf8("plain ascii").ok());
  EXPECT_TRUE(ValidateUtf8("héllo 你好 😀 \xF4\x8F\xBF\xBF").ok());  // Up to U+10FFFF.
  EXPECT_TRUE(ValidateUtf8(std::string("nul\0inside", 10)).ok());
}

TEST(Utf8Test, RejectsIllFormedTextNamingTheOffset) {
  struct Case {
    std::string text;
    std::string offset;
  };
  const Case cases[] = {
      {"ab\x80", "offset 2"},            // Lone continuation byte.
      {"\xC0\xAF", "offset 0"},          // Overlong encoding of '/'.
      {"x\xE0\x80\xAF", "offset 1"},     // Overlong three-byte form.
      {"xy\xED\xA0\x80", "offset 2"},    // UTF-16 surrogate U+D800.
      {"\xF4\x90\x80\x80", "offset 0"},  // Above U+10FFFF.
      {"abc\xE4\xBD", "offset 3"},       // Truncated at the end.
      {"\xFF", "offset 0"},              // Never valid.
      {"ok \xC3(", "offset 3"},          // Lead byte followed by ASCII.
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateUtf8(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.offset;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.offset));
  }
}

TEST(Utf8Test, EncodeDecodeRoundTripsEveryScalarValue) {
  int checked = 0;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    AppendUtf8(cp, &s);
    ASSERT_TRUE(ValidateUtf8(s).ok()) << std::hex << static_cast<uint32_t>(cp);
    int len = 0;
    ASSERT_EQ(DecodeUtf8At(s, 0, &len), cp);
    ASSERT_EQ(static_cast<size_t>(len), s.size());
    ++checked;
  }
  EXPECT_EQ(checked, 0x110000 - 0x800);
}

// The example of "U+FFFD Substitution of Maximal Subparts" in chapter 3 of
// the Unicode Standard: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
// DecodeUtf8Next walks any bytes: valid code points as themselves, each
// maximal ill-formed subpart as one U+FFFD, never past the end.
TEST(Utf8Test, DecodeNextIsTotalAndSkipsMaximalSubparts) {
  // "a", U+00E9, U+1F600, then a truncated 3-byte lead pair, a lone
  // continuation byte, an overlong C0 80, and a 4-byte sequence cut short.
  const std::string text =
      "a\xC3\xA9\xF0\x9F\x98\x80\xE2\x82"
      "b\x80\xC0\x80\xF0\x9F\x98";
  std::vector<char32_t> got;
  std::vector<size_t> ends;
  for (size_t pos = 0; pos < text.size();) {
    got.push_back(DecodeUtf8Next(text, &pos));
    ends.push_back(pos);
  }
  EXPECT_EQ(got, (std::vector<char32_t>{'a', 0xE9, 0x1F600, kReplacementChar, 'b', kReplacementChar,
                                        kReplacementChar, kReplacementChar, kReplacementChar}));
  EXPECT_EQ(ends, (std::vector<size_t>{1, 3, 7, 9, 10, 11, 12, 13, 16}));
  std::string lossy;
  AppendUtf8Lossy(text, /*final=*/true, &lossy);
  std::string walked;
  for (char32_t cp : got) AppendUtf8(cp, &walked);
  EXPECT_EQ(walked, lossy);
}

TEST(Utf8Test, LossyDecodingReplacesMaximalSubparts) {
  const std::string input = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string expected =
      "a" + Fffd(1) + Fffd(1) + Fffd(1) + "b" + Fffd(1) + "c" + Fffd(2) + "d";
  EXPECT_EQ(ReplaceInvalidUtf8(input), expected);
  // Surrogates and overlongs: each byte is its own maximal subpart.
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), Fffd(3));
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\xAF"), Fffd(2));
  // Valid text passes through unchanged.
  EXPECT_EQ(ReplaceInvalidUtf8("héllo 😀"), "héllo 😀");
}

TEST(Utf8Test, StreamingKeepsAnIncompleteTailUntilFinal) {
  const std::string smile = "\xF0\x9F\x98\x80";  // U+1F600
  std::string out;
  // All but the last byte: nothing can be emitted yet.
  EXPECT_EQ(AppendUtf8Lossy("a" + smile.substr(0, 3), /*final=*/false, &out), 1u);
  EXPECT_EQ(out, "a");
  // With `final`, the same tail becomes a single U+FFFD.
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("a" + smile.substr(0, 3), /*final=*/true, &out), 4u);
  EXPECT_EQ(out, "a" + Fffd(1));
  // A tail that can never complete is replaced at once, even when not final.
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("\xE4\xBD"
                            "x",
                            /*final=*/false, &out),
            3u);
  EXPECT_EQ(out, Fffd(1) + "x");
}

}  // namespace
}  // namespace tessera::tokenizer
