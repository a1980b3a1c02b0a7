#include "kernels/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels {
namespace {

using ::testing::HasSubstr;

TEST(BackendOverrideTest, AutoAndKnownNamesAreValid) {
  for (const BackendFlag& f : BackendFlags()) {
    EXPECT_TRUE(ValidateBackendOverride(f.flag, "auto").ok()) << f.flag;
    for (const std::string& name : KnownBackends(f.flag)) {
      EXPECT_TRUE(ValidateBackendOverride(f.flag, name).ok()) << f.flag << "=" << name;
    }
  }
}

TEST(BackendOverrideTest, UnknownNameIsAnErrorListingChoices) {
  absl::Status s = ValidateBackendOverride("attention_backend", "flashinfer9");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--attention_backend=flashinfer9"));
  EXPECT_THAT(s.message(), HasSubstr("valid choices: auto, cpu_reference"));
}

TEST(BackendOverrideTest, UnknownFlagIsAnError) {
  EXPECT_FALSE(ValidateBackendOverride("warp_backend", "auto").ok());
}

}  // namespace
}  // namespace tessera::kernels
