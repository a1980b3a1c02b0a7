#include "base/json.h"

#include <stdlib.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(JsonUtilTest, ParsesValidJson) {
  absl::StatusOr<nlohmann::json> j = ParseJsonStrict(R"( {"a": [1, {"b": null}], "c": "d"} )");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["c"], "d");
  EXPECT_TRUE((*j)["a"][1]["b"].is_null());
}

TEST(JsonUtilTest, ReportsSyntaxErrorPosition) {
  absl::StatusOr<nlohmann::json> j = ParseJsonStrict(R"({"a": tru})");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(j.status()), HasSubstr("invalid JSON at byte"));
  EXPECT_FALSE(ParseJsonStrict("").ok());
  EXPECT_FALSE(ParseJsonStrict("{} {}").ok());
  EXPECT_FALSE(ParseJsonStrict(std::string("{\"a\":\"\xff\"}")).ok()) << "invalid UTF-8";
}

TEST(JsonUtilTest, RejectsDuplicateKeysAtAnyDepthWithTheirPath) {
  EXPECT_THAT(Msg(ParseJsonStrict(R"({"a": 1, "a": 2})").status()),
              HasSubstr("duplicate key \"a\" at the top level"));
  EXPECT_THAT(Msg(ParseJsonStrict(R"({"x": [0, {"k": 1, "k": 1}]})").status()),
              HasSubstr("duplicate key \"k\" in object at /x/1"));
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJsonStrict(R"([{"k": 1}, {"k": 2}])").ok());
}

TEST(JsonUtilTest, OrderedParseKeepsKeyOrderAndStaysStrict) {
  absl::StatusOr<nlohmann::ordered_json> j =
      ParseOrderedJsonStrict(R"({"z": 1, "a": {"y": 2, "b": 3}})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->dump(), R"({"z":1,"a":{"y":2,"b":3}})");
  EXPECT_EQ(JsonTypeName(*j), "object");
  absl::StatusOr<nlohmann::ordered_json> dup = ParseOrderedJsonStrict(R"({"a": {"k": 1, "k": 2}})");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(Msg(dup.status()), HasSubstr("duplicate key \"k\" in object at /a"));
}

TEST(JsonUtilTest, DeepNestingDoesNotCrash) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  absl::StatusOr<nlohmann::json> j = ParseJsonStrict(deep);
  EXPECT_TRUE(j.ok()) << j.status();
}

TEST(JsonUtilTest, ReadJsonFileChecksSizeAndType) {
  std::string dir = ::testing::TempDir() + "json_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    std::ofstream out(dir + "/big.json", std::ios::binary);
    out << std::string(100, ' ') << "{}";
  }
  absl::StatusOr<nlohmann::json> j = ReadJsonFile(dir + "/big.json", 50);
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(Msg(j.status()), HasSubstr("more than the limit of 50"));
  EXPECT_TRUE(ReadJsonFile(dir + "/big.json").ok());
  EXPECT_THAT(Msg(ReadJsonFile(dir).status()), HasSubstr("not a regular file"));
  EXPECT_EQ(ReadJsonFile(dir + "/none.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera
