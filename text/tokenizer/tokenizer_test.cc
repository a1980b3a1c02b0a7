#include "text/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/tokenizer/test_util.h"
#include "text/tokenizer/utf8.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;
using tokenizer::testing::AddedTokenJson;
using tokenizer::testing::MergeId;
using tokenizer::testing::TinySpec;
using tokenizer::testing::TinyTokenizerJson;
using Json = nlohmann::json;

constexpr int kImStart = 300, kImEnd = 301, kThink = 302, kMask = 303, kEAcute = 304, kCat = 305;

// Merges that spell "hello" and " world".
TinySpec HelloSpec() {
  TinySpec spec;
  spec.merges = {{"h", "e"},  {"l", "l"},   {"he", "ll"},  {"hell", "o"}, {" ", "w"},
                 {" w", "o"}, {" wo", "r"}, {" wor", "l"}, {" worl", "d"}};
  spec.added_tokens = Json::array({
      AddedTokenJson(kImStart, "<|im_start|>", /*special=*/true),
      AddedTokenJson(kImEnd, "<|im_end|>", /*special=*/true),
      AddedTokenJson(kThink, "<think>", /*special=*/false),
      AddedTokenJson(kMask, "<mask>", /*special=*/true, /*lstrip=*/true, /*rstrip=*/true),
      AddedTokenJson(kEAcute, "\u00e9", /*special=*/false, false, false, /*normalized=*/true),
      AddedTokenJson(kCat, "cat", /*special=*/false, false, false, false, /*single_word=*/true),
  });
  return spec;
}

std::unique_ptr<Tokenizer> Load(const Json& tokenizer_json, const std::string& config = "") {
  auto t = Tokenizer::FromJson(tokenizer_json.dump(), config, "tiny/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// Ids of text that no merge applies to: in the tiny vocabulary, ids 0..255
// are the bytes themselves.
std::vector<int32_t> ByteIds(std::string_view text) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<int32_t> EncodeOk(const Tokenizer& t, std::string_view text, EncodeOptions o = {}) {
  auto ids = t.Encode(text, o);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string DecodeOk(const Tokenizer& t, const std::vector<int32_t>& ids, DecodeOptions o = {}) {
  auto text = t.Decode(ids, o);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(TokenizerTest, EncodesWithMergesAndDecodesBack) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  // "hello" -> he, ll -> hell -> hello (merge 3); " world" -> merge 8.
  EXPECT_THAT(EncodeOk(*t, "hello world"), ElementsAre(MergeId(3), MergeId(8)));
  EXPECT_EQ(DecodeOk(*t, {MergeId(3), MergeId(8)}), "hello world");
  // No merge applies: one id per byte, multi-byte characters included.
  EXPECT_EQ(EncodeOk(*t, "ü 你"), ByteIds("ü 你"));
  EXPECT_EQ(DecodeOk(*t, ByteIds("ü 你")), "ü 你");
  EXPECT_THAT(EncodeOk(*t, ""), ElementsAre());
}

TEST(TokenizerTest, BothMergeEncodingsGiveTheSameTokenizer) {
  TinySpec pairs = HelloSpec();
  TinySpec strings = HelloSpec();
  strings.string_merges = true;
  auto a = Load(TinyTokenizerJson(pairs));
  auto b = Load(TinyTokenizerJson(strings));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (const char* text : {"hello world", "hellohello  world!", "well, hello there"}) {
    EXPECT_EQ(EncodeOk(*a, text), EncodeOk(*b, text)) << text;
  }
}

TEST(TokenizerTest, AddedTokensAreMatchedBeforeBpe) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(EncodeOk(*t, "<|im_start|>user\nhi<|im_end|>"),
            Concat({{kImStart}, ByteIds("user\nhi"), {kImEnd}}));
  EXPECT_EQ(EncodeOk(*t, "<think>hello</think>"),
            Concat({{kThink, MergeId(3)}, ByteIds("</think>")}));
  // Partial tokens are ordinary text.
  EXPECT_EQ(EncodeOk(*t, "<|im_start|"), ByteIds("<|im_start|"));
  EXPECT_EQ(EncodeOk(*t, "<<|im_end|>>"), Concat({ByteIds("<"), {kImEnd}, ByteIds(">")}));
}

TEST(TokenizerTest, SplitSpecialTokensEncodesThemAsText) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EncodeOptions o;
  o.split_special_tokens = true;
  EXPECT_EQ(EncodeOk(*t, "<|im_end|>", o), ByteIds("<|im_end|>"));
  // Non-special added tokens are still recognized.
  EXPECT_EQ(EncodeOk(*t, "<think><|im_end|>", o), Concat({{kThink}, ByteIds("<|im_end|>")}));
}

TEST(TokenizerTest, LstripAndRstripAbsorbNeighbouringWhiteSpace) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(EncodeOk(*t, "a \t<mask>\n b"), Concat({ByteIds("a"), {kMask}, ByteIds("b")}));
  // <|im_end|> has neither: the spaces stay with the text.
  EXPECT_EQ(EncodeOk(*t, "a <|im_end|> b"), Concat({ByteIds("a "), {kImEnd}, ByteIds(" b")}));
}

TEST(TokenizerTest, SingleWordTokensOnlyMatchWholeWords) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(EncodeOk(*t, "cat"), ElementsAre(kCat));
  EXPECT_EQ(EncodeOk(*t, "a cat!"), Concat({ByteIds("a "), {kCat}, ByteIds("!")}));
  EXPECT_EQ(EncodeOk(*t, "concat"), ByteIds("concat"));
  EXPECT_EQ(EncodeOk(*t, "cats"), ByteIds("cats"));
}

TEST(TokenizerTest, NfcNormalizerAndNormalizedAddedTokens) {
  TinySpec spec = HelloSpec();
  auto raw = Load(TinyTokenizerJson(spec));
  spec.normalizer = {{"type", "NFC"}};
  auto nfc = Load(TinyTokenizerJson(spec));
  ASSERT_NE(raw, nullptr);
  ASSERT_NE(nfc, nullptr);
  EXPECT_TRUE(nfc->normalizes_nfc());
  // Decomposed "é" becomes U+00E9 under NFC and then matches the added
  // token marked "normalized"; without the normalizer it stays two pieces.
  EXPECT_THAT(EncodeOk(*nfc, "e\u0301"), ElementsAre(kEAcute));
  EXPECT_THAT(EncodeOk(*nfc, "\u00e9"), ElementsAre(kEAcute));
  EXPECT_EQ(EncodeOk(*raw, "e\u0301"), ByteIds("e\u0301"));
  EXPECT_EQ(EncodeOk(*nfc, "Cafe\u0301 \u212b"),
            Concat({ByteIds("Caf"), {kEAcute}, ByteIds(" \u00c5")}));
}

TEST(TokenizerTest, InvalidUtf8IsRejectedWithItsOffset) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  for (const std::string& bad : {std::string("ab\xFF"), std::string("ab\xC3"),
                                 std::string("ab\xED\xA0\x80"), std::string("ab\xC0\x80")}) {
    auto ids = t->Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("byte offset 2"));
  }
  // Embedded NUL is valid UTF-8.
  EXPECT_EQ(EncodeOk(*t, std::string("a\0b", 3)), ByteIds(std::string("a\0b", 3)));
}

TEST(TokenizerTest, DecodeHandlesSpecialTokensAndBrokenBytes) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> chat = {kImStart, MergeId(3), kThink, kImEnd};
  EXPECT_EQ(DecodeOk(*t, chat), "<|im_start|>hello<think><|im_end|>");
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(DecodeOk(*t, chat, skip), "hello<think>");
  // A lone lead byte decodes to U+FFFD.
  EXPECT_EQ(DecodeOk(*t, {0xC3}), "\uFFFD");
  // Byte runs do not join across an added token ...
  EXPECT_EQ(DecodeOk(*t, {0xC3, kImStart, 0xA9}), "\uFFFD<|im_start|>\uFFFD");
  // ... but a skipped special token is simply absent.
  EXPECT_EQ(DecodeOk(*t, {0xC3, kImStart, 0xA9}, skip), "\u00e9");
}

TEST(TokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), kCat + 1);
  for (int32_t bad : {-1, 280, kCat + 1, 1 << 30}) {
    auto text = t->Decode({104, bad});
    ASSERT_FALSE(text.ok()) << bad;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(text.status().message()), HasSubstr("position 1"));
  }
}

TEST(TokenizerTest, CleanUpTokenizationSpaces) {
  EXPECT_EQ(CleanUpTokenizationSpaces("Hello , world . Is it ? Yes ! I 'm sure , they 're"),
            "Hello, world. Is it? Yes! I'm sure, they're");
  EXPECT_EQ(CleanUpTokenizationSpaces("do n't"), "don't");
  // The config's setting is reported but not applied unless asked for.
  auto t = Load(TinyTokenizerJson(HelloSpec()), R"({"clean_up_tokenization_spaces": true})");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->config_clean_up_tokenization_spaces());
  EXPECT_EQ(DecodeOk(*t, ByteIds("a , b .")), "a , b .");
  DecodeOptions clean;
  clean.clean_up_tokenization_spaces = true;
  EXPECT_EQ(DecodeOk(*t, ByteIds("a , b ."), clean), "a, b.");
}

TEST(TokenizerTest, TokenAndIdLookups) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->TokenToId("\u0120w"), MergeId(4));  // "Ġw" is " w" in the byte alphabet.
  EXPECT_EQ(t->IdToToken(MergeId(4)), "\u0120w");
  EXPECT_EQ(t->TokenToId("<|im_end|>"), kImEnd);
  EXPECT_EQ(t->IdToToken(kImEnd), "<|im_end|>");
  EXPECT_EQ(t->TokenToId("not a token"), std::nullopt);
  EXPECT_EQ(t->IdToToken(290), std::nullopt);
  EXPECT_TRUE(t->IsSpecialToken(kImStart));
  EXPECT_FALSE(t->IsSpecialToken(kThink));
  EXPECT_FALSE(t->IsSpecialToken(104));
  ASSERT_NE(t->Piece(0xC3), nullptr);
  EXPECT_EQ(t->Piece(0xC3)->text, "\xC3");
}

TEST(TokenizerTest, BosAndEosFromTokenizerConfig) {
  const std::string config = R"({
    "bos_token": "<|im_start|>", "add_bos_token": true,
    "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}, "add_eos_token": true,
    "pad_token": null, "chat_template": "{{ messages }}",
    "additional_special_tokens": ["<think>"]
  })";
  auto t = Load(TinyTokenizerJson(HelloSpec()), config);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bos_token_id(), kImStart);
  EXPECT_EQ(t->eos_token_id(), kImEnd);
  EXPECT_EQ(t->pad_token_id(), std::nullopt);
  EXPECT_EQ(t->chat_template(), "{{ messages }}");
  EXPECT_EQ(EncodeOk(*t, "hi"), Concat({{kImStart}, ByteIds("hi"), {kImEnd}}));
  EncodeOptions plain;
  plain.add_special_tokens = false;
  EXPECT_EQ(EncodeOk(*t, "hi", plain), ByteIds("hi"));
  // additional_special_tokens makes <think> special for skipping.
  EXPECT_TRUE(t->IsSpecialToken(kThink));
}

TEST(TokenizerTest, TemplateProcessingAddsItsTokens) {
  TinySpec spec = HelloSpec();
  spec.post_processor = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", Json::array()},
      {"special_tokens",
       {{"<|im_start|>",
         {{"id", "<|im_start|>"}, {"ids", {kImStart}}, {"tokens", {"<|im_start|>"}}}}}}};
  auto t = Load(TinyTokenizerJson(spec));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(EncodeOk(*t, "hi"), Concat({{kImStart}, ByteIds("hi")}));
  EXPECT_THAT(t->prefix_ids(), ElementsAre(kImStart));
  EXPECT_THAT(t->suffix_ids(), ElementsAre());
}

TEST(TokenizerTest, RoundTripsRandomText) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  const std::vector<std::string> alphabet = {"h",  "e", "l",  "o", " ",  "w", "r", "d", "\n",
                                             "\t", "é", "你", "😀", "'s", "1", "<", "|", "!"};
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    std::string text;
    const int n = rng() % 40;
    for (int k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
    auto ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << text;
    EXPECT_EQ(DecodeOk(*t, *ids), text);
  }
}

TEST(TokenizerTest, BadInputToDecodeAndEncodeNeverCrashes) {
  auto t = Load(TinyTokenizerJson(HelloSpec()));
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(rng() % 16, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    auto ids = t->Encode(bytes);
    EXPECT_EQ(ids.ok(), tokenizer::ValidateUtf8(bytes).ok());
    std::vector<int32_t> random_ids(rng() % 8);
    for (int32_t& id : random_ids) id = static_cast<int32_t>(rng() % 320) - 5;
    auto text = t->Decode(random_ids);
    if (text.ok()) {
      EXPECT_TRUE(tokenizer::ValidateUtf8(*text).ok());
    }
  }
}

// --- Loading errors -------------------------------------------------------

absl::Status LoadError(const Json& j, const std::string& config = "") {
  return Tokenizer::FromJson(j.dump(), config, "bad/tokenizer.json").status();
}

TEST(TokenizerLoadTest, MissingFileNamesThePath) {
  auto t = Tokenizer::FromFiles("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/nonexistent/dir/tokenizer.json"));
  auto d = Tokenizer::FromDirectory("/nonexistent/dir");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerLoadTest, BadJsonNamesFileAndByte) {
  auto t = Tokenizer::FromJson(R"({"model": {"type": "BPE",)", "", "bad/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("bad/tokenizer.json"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("byte"));
  auto c = Tokenizer::FromJson(TinyTokenizerJson(HelloSpec()).dump(), "{oops", "x.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("tokenizer_config.json"));
}

TEST(TokenizerLoadTest, UnsupportedComponentsAreNamed) {
  Json j = TinyTokenizerJson(HelloSpec());
  j["model"]["type"] = "WordPiece";
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("\"WordPiece\" is not supported"));
  j = TinyTokenizerJson(HelloSpec());
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("Metaspace"));
  j = TinyTokenizerJson(HelloSpec());
  j["pre_tokenizer"]["pretokenizers"].erase(1);  // No ByteLevel step left.
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("byte-level"));
  j = TinyTokenizerJson(HelloSpec());
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("Lowercase"));
  j = TinyTokenizerJson(HelloSpec());
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("decoder"));
  j = TinyTokenizerJson(HelloSpec());
  j["model"]["byte_fallback"] = true;
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("byte_fallback"));
  j = TinyTokenizerJson(HelloSpec());
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(";
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("cannot compile"));
}

TEST(TokenizerLoadTest, InconsistentContentsAreNamed) {
  Json j = TinyTokenizerJson(HelloSpec());
  j["model"]["merges"].push_back(Json::array({"h", "\u0120nope"}));
  absl::Status s = LoadError(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bad/tokenizer.json"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown token"));
  j = TinyTokenizerJson(HelloSpec());
  j["model"]["merges"].push_back("h e l");
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("model.merges[9]"));
  j = TinyTokenizerJson(HelloSpec());
  j["model"]["vocab"]["x"] = "not an id";
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("integer id"));
  j = TinyTokenizerJson(HelloSpec());
  j.erase("model");
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("missing \"model\""));
  j = TinyTokenizerJson(HelloSpec());
  j["added_tokens"].push_back(AddedTokenJson(kImStart, "<dup>", true));
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("appears twice"));
  EXPECT_THAT(std::string(LoadError(Json::array()).message()), HasSubstr("expected object"));
  // Config problems name the config.
  j = TinyTokenizerJson(HelloSpec());
  s = LoadError(j, R"({"add_bos_token": "yes"})");
  EXPECT_THAT(std::string(s.message()), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("add_bos_token"));
  s = LoadError(j, R"({"add_bos_token": true})");
  EXPECT_THAT(std::string(s.message()), HasSubstr("bos_token"));
}

TEST(TokenizerLoadTest, HostileSizesAndNestingAreErrorsNotCrashes) {
  Json j = TinyTokenizerJson(HelloSpec());
  j["model"]["vocab"]["huge"] = 2000000000;
  EXPECT_THAT(std::string(LoadError(j).message()), HasSubstr("out of range"));
  j = TinyTokenizerJson(HelloSpec());
  j["added_tokens"].push_back(AddedTokenJson(2000000000, "<big>", true));
  EXPECT_EQ(LoadError(j).code(), absl::StatusCode::kInvalidArgument);
  // Deep nesting, written as text (nlohmann's own dump() would recurse).
  std::string text = TinyTokenizerJson(HelloSpec()).dump();
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += R"({"type": "Sequence", "normalizers": [)";
  nested += R"({"type": "NFC"})";
  for (int i = 0; i < 100000; ++i) nested += "]}";
  const std::string key = R"("normalizer":null)";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"normalizer\":" + nested);
  auto deep = Tokenizer::FromJson(text, "", "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(std::string(deep.status().message()), HasSubstr("nested too deeply"));
}

TEST(TokenizerLoadTest, FromDirectoryReadsBothFiles) {
  const std::string dir = ::testing::TempDir() + "/tokenizer_load_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << TinyTokenizerJson(HelloSpec()).dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|im_end|>"})";
  auto t = Tokenizer::FromDirectory(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->eos_token_id(), kImEnd);
  std::ofstream(dir + "/tokenizer.json") << "[not json";
  auto bad = Tokenizer::FromDirectory(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(dir + "/tokenizer.json"));
}

}  // namespace
}  // namespace tessera
