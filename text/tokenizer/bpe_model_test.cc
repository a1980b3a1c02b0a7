#include "text/tokenizer/bpe_model.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ids: a=0 b=1 c=2 d=3 ab=4 bc=5 abc=6 cd=7 aa=8 <unk>=9 bcd=10 (no merge
// produces bcd; it exists only for ignore_merges).
BpeConfig SmallConfig() {
  BpeConfig c;
  c.vocab = {{"a", 0},   {"b", 1},  {"c", 2},  {"d", 3},     {"ab", 4},  {"bc", 5},
             {"abc", 6}, {"cd", 7}, {"aa", 8}, {"<unk>", 9}, {"bcd", 10}};
  c.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"c", "d"}, {"a", "a"}};
  return c;
}

std::vector<int32_t> Encode(const BpeModel& m, std::string_view word) {
  std::vector<int32_t> ids;
  m.EncodeWord(word, &ids);
  return ids;
}

std::unique_ptr<BpeModel> Make(BpeConfig c) {
  auto m = BpeModel::Create(std::move(c), "test.json");
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

TEST(BpeModelTest, AppliesMergesByRankNotPosition) {
  auto m = Make(SmallConfig());
  EXPECT_THAT(Encode(*m, "ab"), ElementsAre(4));
  // (b,c) outranks (a,b), so "abc" merges to [a, bc] and then [abc].
  EXPECT_THAT(Encode(*m, "abc"), ElementsAre(6));
  // (b,c) also beats (c,d): [a, bc, d] -> [abc, d].
  EXPECT_THAT(Encode(*m, "abcd"), ElementsAre(6, 3));
  EXPECT_THAT(Encode(*m, "cd"), ElementsAre(7));
  EXPECT_THAT(Encode(*m, "d"), ElementsAre(3));
  EXPECT_THAT(Encode(*m, ""), ElementsAre());
}

TEST(BpeModelTest, EqualRanksMergeLeftmostFirst) {
  auto m = Make(SmallConfig());
  EXPECT_THAT(Encode(*m, "aaa"), ElementsAre(8, 0));
  EXPECT_THAT(Encode(*m, "aaaaa"), ElementsAre(8, 8, 0));
}

TEST(BpeModelTest, LongWordsAreLinearithmicNotQuadratic) {
  auto m = Make(SmallConfig());
  const std::vector<int32_t> ids = Encode(*m, std::string(200001, 'a'));
  ASSERT_EQ(ids.size(), 100001u);
  for (size_t i = 0; i + 1 < ids.size(); ++i) ASSERT_EQ(ids[i], 8);
  EXPECT_EQ(ids.back(), 0);
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  BpeConfig c = SmallConfig();
  EXPECT_THAT(Encode(*Make(c), "bcd"), ElementsAre(5, 3));
  c.ignore_merges = true;
  EXPECT_THAT(Encode(*Make(c), "bcd"), ElementsAre(10));
}

TEST(BpeModelTest, BytesWithoutTokensUseUnkOrAreDropped) {
  // Without unk_token the byte disappears and its neighbours may merge.
  EXPECT_THAT(Encode(*Make(SmallConfig()), "azb"), ElementsAre(4));
  BpeConfig c = SmallConfig();
  c.unk_token = "<unk>";
  EXPECT_THAT(Encode(*Make(c), "azzb"), ElementsAre(0, 9, 9, 1));
  c.fuse_unk = true;
  EXPECT_THAT(Encode(*Make(c), "azzb"), ElementsAre(0, 9, 1));
  EXPECT_EQ(Make(SmallConfig())->missing_byte_tokens(), 256 - 4);
}

TEST(BpeModelTest, LooksUpTokensBothWays) {
  auto m = Make(SmallConfig());
  EXPECT_EQ(m->TokenToId("abc"), 6);
  EXPECT_EQ(m->TokenToId("zzz"), std::nullopt);
  ASSERT_NE(m->IdToToken(6), nullptr);
  EXPECT_EQ(*m->IdToToken(6), "abc");
  EXPECT_EQ(m->IdToToken(11), nullptr);
  EXPECT_EQ(m->IdToToken(-1), nullptr);
  EXPECT_EQ(m->max_id(), 10);
  EXPECT_EQ(m->num_merges(), 5u);
}

TEST(BpeModelTest, CachesRepeatedWordsWithoutChangingResults) {
  auto m = Make(SmallConfig());
  EXPECT_EQ(m->CachedWords(), 0u);
  const auto first = Encode(*m, "abcdabcd");
  EXPECT_EQ(m->CachedWords(), 1u);
  EXPECT_EQ(Encode(*m, "abcdabcd"), first);
  EXPECT_EQ(m->CachedWords(), 1u);
}

TEST(BpeModelTest, ConcurrentEncodingAgreesWithSequential) {
  auto m = Make(SmallConfig());
  std::vector<std::string> words;
  for (int i = 0; i < 3000; ++i) {
    std::string w;
    for (int k = 0, x = i; k < 1 + i % 9; ++k, x = x * 7 + 3) w += "abcd"[x % 4];
    words.push_back(w);
  }
  std::vector<std::vector<int32_t>> expected;
  {
    auto fresh = Make(SmallConfig());
    for (const auto& w : words) expected.push_back(Encode(*fresh, w));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < words.size(); i += 2) {
          if (Encode(*m, words[i]) != expected[i]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

TEST(BpeModelTest, RejectsInconsistentFiles) {
  BpeConfig c = SmallConfig();
  c.merges.push_back({"a", "q"});
  auto s = BpeModel::Create(c, "models/x/tokenizer.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("models/x/tokenizer.json"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("merge #5"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("unknown token \"q\""));

  c = SmallConfig();
  c.merges.push_back({"d", "a"});  // "da" is not in the vocabulary.
  s = BpeModel::Create(c, "t.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("\"da\""));

  c = SmallConfig();
  c.vocab.push_back({"dup", 3});
  s = BpeModel::Create(c, "t.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("id 3"));

  c = SmallConfig();
  c.vocab.push_back({"neg", -5});
  EXPECT_FALSE(BpeModel::Create(c, "t.json").ok());

  c = SmallConfig();
  c.unk_token = "<missing>";
  s = BpeModel::Create(c, "t.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("unk_token"));
}

}  // namespace
}  // namespace tessera::tokenizer
