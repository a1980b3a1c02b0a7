#include "text/tokenizer/incremental_detokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/tokenizer/test_util.h"
#include "text/tokenizer/utf8.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using tokenizer::testing::AddedTokenJson;
using tokenizer::testing::TinySpec;
using tokenizer::testing::TinyTokenizerJson;

constexpr int kEnd = 300, kTool = 301;

// A vocabulary where ids 0..255 are single bytes, so every multi-byte
// character is necessarily split across tokens; merges 256, 257 join the
// first two and last two bytes of "😀" (F0 9F 98 80).
std::unique_ptr<Tokenizer> MakeTokenizer() {
  TinySpec spec;
  spec.merges = {{"\xF0", "\x9F"}, {"\x98", "\x80"}};
  spec.added_tokens = nlohmann::json::array({AddedTokenJson(kEnd, "<|end|>", /*special=*/true),
                                             AddedTokenJson(kTool, "<tool>", /*special=*/false)});
  auto t = Tokenizer::FromJson(TinyTokenizerJson(spec).dump());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// Feeds ids one at a time; checks every delta and returns them.
std::vector<std::string> Stream(IncrementalDetokenizer& d, const std::vector<int32_t>& ids) {
  std::vector<std::string> deltas;
  for (int32_t id : ids) {
    auto delta = d.Add(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    if (!delta.ok()) continue;
    EXPECT_TRUE(tokenizer::ValidateUtf8(*delta).ok()) << "delta is not valid UTF-8";
    deltas.push_back(*delta);
  }
  deltas.push_back(d.Finish());
  EXPECT_TRUE(tokenizer::ValidateUtf8(deltas.back()).ok());
  return deltas;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

TEST(IncrementalDetokenizerTest, HoldsBackSplitCharactersUntilComplete) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(t.get());
  // "é" = C3 A9: nothing after the first byte, the character after the second.
  auto a = d.Add(0xC3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  auto b = d.Add(0xA9);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "\u00e9");
  EXPECT_EQ(d.pending_bytes(), 0u);
  // "😀" as two merged tokens of two bytes each.
  auto c = d.Add(256);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, "");
  auto e = d.Add(257);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, "\U0001F600");
  EXPECT_EQ(d.Finish(), "");
  EXPECT_EQ(d.num_tokens(), 0u);
}

TEST(IncrementalDetokenizerTest, ConcatenatedDeltasEqualDecode) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  const std::string texts[] = {"plain",
                               "héllo wörld",
                               "你好，世界",
                               "👨‍👩‍👧‍👦 family",
                               "mixed 😀<|end|> tail <tool>ok",
                               "\n\t  spaces  "};
  for (const std::string& text : texts) {
    auto ids = t->Encode(text);
    ASSERT_TRUE(ids.ok());
    IncrementalDetokenizer d(t.get());
    const std::vector<std::string> deltas = Stream(d, *ids);
    auto full = t->Decode(*ids);
    ASSERT_TRUE(full.ok());
    EXPECT_EQ(Join(deltas), *full);
    EXPECT_EQ(Join(deltas), text);
  }
}

TEST(IncrementalDetokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(t.get());
  // A stray continuation byte is known to be invalid at once.
  auto a = d.Add(0x80);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "\uFFFD");
  // A lead byte followed by ASCII: the lead byte is replaced when the ASCII
  // arrives.
  auto b = d.Add(0xE4);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "");
  auto c = d.Add('x');
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, "\uFFFDx");
  // A stream that ends inside a character: Finish() emits U+FFFD, as a
  // whole-sequence Decode does.
  auto e = d.Add(0xF0);
  ASSERT_TRUE(e.ok());
  auto f = d.Add(0x9F);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*e + *f, "");
  EXPECT_EQ(d.Finish(), "\uFFFD");
  auto whole = t->Decode({0x80, 0xE4, 'x', 0xF0, 0x9F});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, "\uFFFD\uFFFDx\uFFFD");
}

TEST(IncrementalDetokenizerTest, AddedTokensEndAByteRunLikeDecode) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> ids = {0xC3, kTool, 0xA9, kEnd, 'a'};
  IncrementalDetokenizer d(t.get());
  EXPECT_EQ(Join(Stream(d, ids)), *t->Decode(ids));
  // Skipping special tokens: <|end|> vanishes, <tool> (not special) stays.
  IncrementalDetokenizer skip(t.get(), /*skip_special_tokens=*/true);
  DecodeOptions o;
  o.skip_special_tokens = true;
  const std::vector<int32_t> ids2 = {0xC3, kEnd, 0xA9, kTool};
  EXPECT_EQ(Join(Stream(skip, ids2)), *t->Decode(ids2, o));
  EXPECT_EQ(*t->Decode(ids2, o), "\u00e9<tool>");
}

TEST(IncrementalDetokenizerTest, UnknownIdIsAnErrorAndTheStreamContinues) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(t.get());
  ASSERT_TRUE(d.Add(0xC3).ok());
  auto bad = d.Add(99999);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("99999"));
  auto next = d.Add(0xA9);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, "\u00e9");
}

TEST(IncrementalDetokenizerTest, RandomByteStreamsMatchDecode) {
  auto t = MakeTokenizer();
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) {
    std::vector<int32_t> ids(rng() % 12);
    for (int32_t& id : ids) {
      const int r = static_cast<int>(rng() % 20);
      id = r == 0 ? kEnd : r == 1 ? kTool : r < 4 ? 256 + r % 2 : static_cast<int32_t>(rng() % 256);
    }
    for (bool skip : {false, true}) {
      IncrementalDetokenizer d(t.get(), skip);
      DecodeOptions o;
      o.skip_special_tokens = skip;
      auto full = t->Decode(ids, o);
      ASSERT_TRUE(full.ok());
      EXPECT_EQ(Join(Stream(d, ids)), *full);
    }
  }
}

}  // namespace
}  // namespace tessera
