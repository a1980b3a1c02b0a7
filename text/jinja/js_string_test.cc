// JavaScript string and number semantics over UTF-8.
#include "text/jinja/js_string.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace tessera::text::jinja {
namespace {

TEST(JsStringTest, NumberToString) {
  EXPECT_EQ(JsNumberToString(0), "0");
  EXPECT_EQ(JsNumberToString(-0.0), "0");
  EXPECT_EQ(JsNumberToString(1), "1");
  EXPECT_EQ(JsNumberToString(-42), "-42");
  EXPECT_EQ(JsNumberToString(0.5), "0.5");
  EXPECT_EQ(JsNumberToString(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(JsNumberToString(1e21), "1e+21");
  EXPECT_EQ(JsNumberToString(1e20), "100000000000000000000");
  EXPECT_EQ(JsNumberToString(1.5e-7), "1.5e-7");
  EXPECT_EQ(JsNumberToString(0.000001), "0.000001");
  EXPECT_EQ(JsNumberToString(123456789.125), "123456789.125");
  EXPECT_EQ(JsNumberToString(NAN), "NaN");
  EXPECT_EQ(JsNumberToString(-INFINITY), "-Infinity");
}

TEST(JsStringTest, WhitespaceAndTrim) {
  EXPECT_EQ(JsTrim(" \t\n\u00a0\u3000\ufeffx y\u2028\u2029\u205f"), "x y");
  // Not whitespace for JavaScript: NEL, zero width space, Mongolian vowel separator.
  EXPECT_EQ(JsTrim("\u0085x\u200b"), "\u0085x\u200b");
  EXPECT_EQ(JsTrimStart("  a  "), "a  ");
  EXPECT_EQ(JsTrimEnd("  a  "), "  a");
}

TEST(JsStringTest, Lengths) {
  EXPECT_EQ(Utf16Length("abc"), 3);
  EXPECT_EQ(Utf16Length("h\xc3\xa9"), 2);
  EXPECT_EQ(Utf16Length("\xf0\x9f\x98\x80"), 2);  // one astral code point
  EXPECT_EQ(CodePointCount("\xf0\x9f\x98\x80"), 1);
}

TEST(JsStringTest, JsonStrings) {
  std::string out;
  AppendJsonString("a\"\\\n\t\x01\x7f\xc3\xa9\xf0\x9f\x98\x80", false, &out);
  EXPECT_EQ(out, "\"a\\\"\\\\\\n\\t\\u0001\x7f\xc3\xa9\xf0\x9f\x98\x80\"");
  out.clear();
  AppendJsonString("\x7f\xc3\xa9\xf0\x9f\x98\x80", true, &out);
  EXPECT_EQ(out, "\"\\u007f\\u00e9\\ud83d\\ude00\"");
}

TEST(JsStringTest, ParseIntAndFloat) {
  EXPECT_EQ(JsParseInt("  42abc"), 42);
  EXPECT_EQ(JsParseInt("-7"), -7);
  EXPECT_FALSE(JsParseInt("abc").has_value());
  EXPECT_EQ(JsParseFloat("4.5e2x"), 450);
  EXPECT_EQ(JsParseFloat(".5"), 0.5);
  EXPECT_TRUE(std::isinf(*JsParseFloat("Infinity")));
  EXPECT_FALSE(JsParseFloat("e5").has_value());
}

TEST(JsStringTest, StringToNumber) {
  EXPECT_EQ(JsStringToNumber(""), 0);
  EXPECT_EQ(JsStringToNumber(" 12 "), 12);
  EXPECT_EQ(JsStringToNumber("0x10"), 16);
  EXPECT_TRUE(std::isnan(JsStringToNumber("12px")));
  EXPECT_EQ(JsStringToNumber("-1.5e1"), -15);
}

TEST(JsStringTest, CaseMapping) {
  EXPECT_EQ(*JsToUpper("abc XYZ 123"), "ABC XYZ 123");
  EXPECT_EQ(*JsToLower("ABC xyz"), "abc xyz");
  EXPECT_EQ(*JsToUpper("\xe4\xbd\xa0\xe5\xa5\xbd"), "\xe4\xbd\xa0\xe5\xa5\xbd");  // CJK has no case
  EXPECT_FALSE(JsToUpper("stra\xc3\x9f" "e").ok());  // U+00DF upper-cases to two letters
}

}  // namespace
}  // namespace tessera::text::jinja
