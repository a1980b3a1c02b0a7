// Parity of Tokenizer with Hugging Face `tokenizers` 0.23.2 on the trained
// tokenizer of the test model pair (models/target, models/draft; see
// models/MODEL_CARD.md). The reference ids come from
// models/fixtures/tokenizer_expected.json (200 texts: edge cases, non-ASCII
// lines, special tokens written in the text, held-out snippets of the
// corpus) and from the prompts of models/fixtures/{target,draft}_expected.json.
//
// For every text: Encode(text) (default options, as the reference used)
// gives exactly the expected ids; Decode(ids) gives the text back; and the
// incremental detokenizer fed one id at a time produces the same text. The
// two model directories must hold the same tokenizer.
//
// Thread-safety: single-threaded test.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer/incremental_detokenizer.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

std::string ModelsDir() {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src != nullptr ? src : ".", "/models");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Loads a JSON file; null (and a test failure) when missing or malformed.
Json LoadJson(const std::string& path) {
  const std::string text = ReadAll(path);
  EXPECT_FALSE(text.empty()) << "missing or empty " << path;
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "malformed JSON in " << path;
  return j.is_discarded() ? Json() : j;
}

// Shows a string with control characters escaped, for failure messages.
std::string Show(const std::string& s) {
  std::string shown = Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
  return shown.size() > 200 ? shown.substr(0, 200) + "..." : shown;
}

// A few ids around position `i`, for failure messages.
std::string Window(const std::vector<int32_t>& ids, size_t i) {
  const size_t begin = i < 4 ? 0 : i - 4;
  const size_t end = std::min(ids.size(), i + 8);
  if (begin >= end) return "";
  return absl::StrJoin(ids.begin() + begin, ids.begin() + end, ",");
}

// Checks encode, decode and incremental decode of one text; returns false
// on the first mismatch (after recording it).
bool CheckText(const Tokenizer& tok, const std::string& text, const std::vector<int32_t>& want,
               const std::string& what) {
  SCOPED_TRACE(absl::StrCat(what, ": ", Show(text)));
  auto ids = tok.Encode(text);
  if (!ids.ok()) {
    ADD_FAILURE() << "Encode failed: " << ids.status();
    return false;
  }
  if (*ids != want) {
    size_t i = 0;
    while (i < ids->size() && i < want.size() && (*ids)[i] == want[i]) ++i;
    ADD_FAILURE() << "ids differ from position " << i << " (of " << want.size()
                  << " expected)\n  got:  ..." << Window(*ids, i) << "\n  want: ..."
                  << Window(want, i);
    return false;
  }
  auto decoded = tok.Decode(want);
  if (!decoded.ok()) {
    ADD_FAILURE() << "Decode failed: " << decoded.status();
    return false;
  }
  if (*decoded != text) {
    ADD_FAILURE() << "Decode gives " << Show(*decoded);
    return false;
  }
  IncrementalDetokenizer detok(&tok);
  std::string streamed;
  for (int32_t id : want) {
    auto piece = detok.Add(id);
    if (!piece.ok()) {
      ADD_FAILURE() << "IncrementalDetokenizer::Add(" << id << ") failed: " << piece.status();
      return false;
    }
    streamed += *piece;
  }
  streamed += detok.Finish();
  if (streamed != text) {
    ADD_FAILURE() << "incremental detokenizer gives " << Show(streamed);
    return false;
  }
  return true;
}

class ModelPairTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromDirectory(ModelsDir() + "/target");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ModelPairTokenizerTest, ConfigurationAsInTheModelCard) {
  EXPECT_EQ(tok_->vocab_size(), 4096);
  EXPECT_EQ(tok_->eos_token_id(), 0);
  EXPECT_FALSE(tok_->bos_token_id().has_value());
  EXPECT_FALSE(tok_->add_bos_token());
  EXPECT_TRUE(tok_->prefix_ids().empty());
  EXPECT_TRUE(tok_->suffix_ids().empty());
  EXPECT_EQ(tok_->TokenToId("<|endoftext|>"), 0);
  EXPECT_EQ(tok_->TokenToId("<|im_start|>"), 1);
  EXPECT_EQ(tok_->TokenToId("<|im_end|>"), 2);
  for (int32_t id : {0, 1, 2}) EXPECT_TRUE(tok_->IsSpecialToken(id)) << id;
}

TEST_F(ModelPairTokenizerTest, DraftHasTheSameTokenizer) {
  EXPECT_EQ(ReadAll(ModelsDir() + "/target/tokenizer.json"),
            ReadAll(ModelsDir() + "/draft/tokenizer.json"));
  auto draft = Tokenizer::FromDirectory(ModelsDir() + "/draft");
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ((*draft)->vocab_size(), tok_->vocab_size());
  EXPECT_EQ((*draft)->eos_token_id(), tok_->eos_token_id());
}

TEST_F(ModelPairTokenizerTest, EncodesAndDecodesTheReferenceTexts) {
  Json cases = LoadJson(ModelsDir() + "/fixtures/tokenizer_expected.json");
  ASSERT_TRUE(cases.is_array());
  ASSERT_EQ(cases.size(), 200u);
  int failures = 0;
  size_t tokens = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"].get<std::string>();
    const std::vector<int32_t> want = cases[i]["ids"].get<std::vector<int32_t>>();
    tokens += want.size();
    if (!CheckText(*tok_, text, want, absl::StrCat("text ", i))) ++failures;
    ASSERT_LT(failures, 10) << "stopping after 10 mismatching texts";
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(tokens, 10000u);  // the file is the real one, not a stub
}

TEST_F(ModelPairTokenizerTest, EncodesTheFixturePrompts) {
  for (const char* model : {"target", "draft"}) {
    SCOPED_TRACE(model);
    Json expected = LoadJson(absl::StrCat(ModelsDir(), "/fixtures/", model, "_expected.json"));
    ASSERT_TRUE(expected.contains("cases"));
    ASSERT_EQ(expected["cases"].size(), 3u);
    for (size_t i = 0; i < expected["cases"].size(); ++i) {
      const Json& c = expected["cases"][i];
      const std::vector<int32_t> ids = c["prompt_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(ids.size(), c["prompt_len"].get<size_t>());
      CheckText(*tok_, c["prompt_text"].get<std::string>(), ids, absl::StrCat("prompt ", i));
      // The greedy continuation decodes to the text transformers decoded.
      auto text = tok_->Decode(c["greedy_ids"].get<std::vector<int32_t>>());
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(*text, c["greedy_text"].get<std::string>()) << "prompt " << i;
    }
  }
}

}  // namespace
}  // namespace tessera
