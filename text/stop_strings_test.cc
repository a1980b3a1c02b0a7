#include "text/stop_strings.h"

#include <random>

#include "gtest/gtest.h"

namespace tessera::router {
namespace {

// Feeds `text` in the given piece sizes; returns everything emitted.
std::string Feed(StopStringMatcher& m, const std::string& text, const std::vector<size_t>& sizes,
                 std::optional<std::string>* matched) {
  std::string out;
  size_t pos = 0, i = 0;
  while (pos < text.size()) {
    size_t n = std::min(sizes[i++ % sizes.size()], text.size() - pos);
    auto r = m.Add(std::string_view(text).substr(pos, n));
    out += r.text;
    if (r.matched) *matched = r.matched;
    pos += n;
  }
  out += m.Finish();
  return out;
}

TEST(StopStringMatcherTest, StopsBeforeTheStopStringAcrossDeltas) {
  StopStringMatcher m({"\n\n", "END"});
  std::optional<std::string> matched;
  std::string out = Feed(m, "hello world\nE\nmore\n\nnever", {1, 2, 3}, &matched);
  EXPECT_EQ(out, "hello world\nE\nmore");
  EXPECT_EQ(matched, "\n\n");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcherTest, HoldsBackOnlyPossiblePrefixes) {
  StopStringMatcher m({"STOP"});
  auto r = m.Add("abcST");
  EXPECT_EQ(r.text, "abc");  // "ST" may begin STOP
  r = m.Add("ART");
  EXPECT_EQ(r.text, "START");  // it did not
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopStringMatcherTest, EarliestOccurrenceWins) {
  StopStringMatcher m({"cd", "bcde"});
  auto r = m.Add("abcdef");
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(r.matched, "bcde");
}

TEST(StopStringMatcherTest, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({"", ""});
  EXPECT_EQ(m.Add("abc").text, "abc");
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopStringMatcherTest, AnySplitGivesTheSameResult) {
  const std::string text = "the cat sat on the mat. The END of the story";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    StopStringMatcher m({"END", "mat."});
    std::vector<size_t> sizes;
    for (int i = 0; i < 8; ++i) sizes.push_back(1 + rng() % 6);
    std::optional<std::string> matched;
    EXPECT_EQ(Feed(m, text, sizes, &matched), "the cat sat on the ");
    EXPECT_EQ(matched, "mat.");
  }
}

}  // namespace
}  // namespace tessera::router
