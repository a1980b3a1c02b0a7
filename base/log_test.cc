#include "base/log.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(LogTest, FormatsLogfmtWithQuotingAndEscapes) {
  std::string line = FormatLogLine(LogLevel::kWarning, "worker", "kv cache almost full",
                                   {{"used", 97}, {"path", "/tmp/a b"}, {"q", "say \"hi\"\n"}});
  EXPECT_NE(line.find(" level=warning svc=worker msg=\"kv cache almost full\""), std::string::npos)
      << line;
  EXPECT_NE(line.find(" used=97"), std::string::npos) << line;
  EXPECT_NE(line.find(" path=\"/tmp/a b\""), std::string::npos) << line;
  EXPECT_NE(line.find(" q=\"say \\\"hi\\\"\\n\""), std::string::npos) << line;
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one event must be one line";
}

TEST(LogTest, ParsesLevels) {
  LogLevel level;
  EXPECT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  EXPECT_TRUE(ParseLogLevel("error", &level));
  EXPECT_EQ(level, LogLevel::kError);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

}  // namespace
}  // namespace tessera
