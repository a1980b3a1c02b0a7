#include "text/tokenizer/pre_tokenizer.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The Split pattern of Llama-3's tokenizer.json (Qwen's differs only in
// using \p{N} for single digits).
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> SplitWith(const RegexSplitter& splitter, std::string_view text) {
  std::vector<std::string_view> pieces;
  const absl::Status s = splitter.Split(text, &pieces);
  EXPECT_TRUE(s.ok()) << s;
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

std::unique_ptr<RegexSplitter> Llama3() {
  auto s = RegexSplitter::Create(kLlama3Pattern, SplitBehavior::kIsolated);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(RewriteWhitespaceEscapesTest, ReplacesOnlyRealEscapes) {
  const std::string out = RewriteWhitespaceEscapes(R"(a\sb[^\s\p{L}]\S\\s\Q\s\E)");
  // \s outside a class becomes a class; inside a class its members are inlined.
  EXPECT_THAT(out, HasSubstr(R"(a[\t\n)"));
  EXPECT_THAT(out, HasSubstr(R"([^\t\n)"));
  EXPECT_THAT(out, HasSubstr(R"(\p{L}])"));
  // An escaped backslash followed by 's' and quoted text stay as written.
  EXPECT_THAT(out, HasSubstr(R"(\\s)"));
  EXPECT_THAT(out, HasSubstr(R"(\Q\s\E)"));
  EXPECT_EQ(RewriteWhitespaceEscapes("plain"), "plain");
}

TEST(RegexSplitterTest, SplitsWordsWithTheirLeadingSpace) {
  auto splitter = Llama3();
  EXPECT_TRUE(splitter->pattern().find("(?i:") != std::string::npos);
  EXPECT_THAT(SplitWith(*splitter, "Hello world!"), ElementsAre("Hello", " world", "!"));
  EXPECT_THAT(SplitWith(*splitter, "你好 世界"), ElementsAre("你好", " 世界"));
}

TEST(RegexSplitterTest, ContractionsAreCaseInsensitive) {
  auto splitter = Llama3();
  EXPECT_THAT(SplitWith(*splitter, "I'M"), ElementsAre("I", "'M"));
  EXPECT_THAT(SplitWith(*splitter, "we'll"), ElementsAre("we", "'ll"));
  EXPECT_THAT(SplitWith(*splitter, "THEY'LL"), ElementsAre("THEY", "'LL"));
  // PCRE2 folds case by Unicode rules, as the reference engine does: the
  // long s (U+017F) matches 's', so "'\u017f" is a contraction and the
  // letter after it starts a new piece.
  EXPECT_THAT(SplitWith(*splitter, "it'\u017fx"), ElementsAre("it", "'\u017f", "x"));
}

TEST(RegexSplitterTest, DigitsGroupInThrees) {
  auto splitter = Llama3();
  EXPECT_THAT(SplitWith(*splitter, "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(SplitWith(*splitter, "x²"), ElementsAre("x", "²"));
}

TEST(RegexSplitterTest, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  auto splitter = Llama3();
  // \s+(?!\S) stops before the last space, which then joins " b".
  EXPECT_THAT(SplitWith(*splitter, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(SplitWith(*splitter, "a \n\n b"), ElementsAre("a", " \n\n", " b"));
  EXPECT_THAT(SplitWith(*splitter, "end  "), ElementsAre("end", "  "));
}

TEST(RegexSplitterTest, WhiteSpaceFollowsTheUnicodeProperty) {
  auto splitter = Llama3();
  // U+FEFF is not White_Space: it attaches to the following letters.
  EXPECT_THAT(SplitWith(*splitter, "\ufeffHi"), ElementsAre("\ufeffHi"));
  // U+180E is not White_Space either (PCRE2's own \s would say it is).
  EXPECT_THAT(SplitWith(*splitter, "a\u180e\u180eb"), ElementsAre("a", "\u180e\u180e", "b"));
  // U+0085 (NEL) is White_Space.
  EXPECT_THAT(SplitWith(*splitter, "a\u0085\u0085b"), ElementsAre("a", "\u0085", "\u0085b"));
}

TEST(RegexSplitterTest, PiecesAlwaysCoverTheInput) {
  auto splitter = Llama3();
  const std::string inputs[] = {"",
                                " ",
                                "a",
                                "\t\n \r\n",
                                "x = 42; // done\n",
                                "😀👍🏽 ok",
                                std::string(100000, ' '),
                                std::string(100000, 'a') + "1234",
                                std::string("\0nul", 4)};
  for (const std::string& in : inputs) {
    EXPECT_EQ(absl::StrJoin(SplitWith(*splitter, in), ""), in);
  }
}

TEST(RegexSplitterTest, HandlesHugePathologicalInputWithoutCrashing) {
  auto splitter = Llama3();
  std::string text;
  for (int i = 0; i < 200000; ++i) text += (i % 7 == 0) ? "\t" : " ";
  text += "x";
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(splitter->Split(text, &pieces).ok());
  std::string joined;
  for (std::string_view p : pieces) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(RegexSplitterTest, DelimiterBehaviors) {
  // The example of the Hugging Face documentation: "the-final--countdown"
  // split on "-".
  auto make = [](SplitBehavior b) {
    auto s = RegexSplitter::CreateLiteral("-", b);
    EXPECT_TRUE(s.ok());
    return *std::move(s);
  };
  const std::string text = "the-final--countdown";
  EXPECT_THAT(SplitWith(*make(SplitBehavior::kRemoved), text),
              ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(SplitWith(*make(SplitBehavior::kIsolated), text),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(SplitWith(*make(SplitBehavior::kMergedWithPrevious), text),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(SplitWith(*make(SplitBehavior::kMergedWithNext), text),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(SplitWith(*make(SplitBehavior::kContiguous), text),
              ElementsAre("the", "-", "final", "--", "countdown"));
}

TEST(RegexSplitterTest, LiteralPatternsEscapeMetacharacters) {
  auto s = RegexSplitter::CreateLiteral(".*", SplitBehavior::kIsolated);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(SplitWith(**s, "a.*b"), ElementsAre("a", ".*", "b"));
}

TEST(RegexSplitterTest, EmptyMatchesDoNotLoop) {
  auto s = RegexSplitter::Create("x*", SplitBehavior::kIsolated);
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(SplitWith(**s, "abxxc"), ElementsAre("a", "b", "xx", "c"));
}

TEST(RegexSplitterTest, BadPatternIsAnErrorWithTheOffset) {
  auto s = RegexSplitter::Create("(unclosed", SplitBehavior::kIsolated);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("offset"));
  EXPECT_FALSE(ParseSplitBehavior("Sideways").ok());
  EXPECT_EQ(*ParseSplitBehavior("mergedWithPrevious"), SplitBehavior::kMergedWithPrevious);
}

TEST(PreTokenizerTest, ByteLevelWithPrefixSpaceAndGpt2Regex) {
  PreTokenizer pre;
  auto gpt2 = RegexSplitter::Create(kGpt2Pattern, SplitBehavior::kIsolated);
  ASSERT_TRUE(gpt2.ok());
  pre.AddByteLevel(/*add_prefix_space=*/true, *std::move(gpt2));
  std::vector<std::string_view> pieces;
  std::deque<std::string> storage;
  ASSERT_TRUE(pre.Run("Hello world", &pieces, &storage).ok());
  EXPECT_THAT(std::vector<std::string>(pieces.begin(), pieces.end()),
              ElementsAre(" Hello", " world"));
  EXPECT_TRUE(pre.has_byte_level());
}

}  // namespace
}  // namespace tessera::tokenizer
