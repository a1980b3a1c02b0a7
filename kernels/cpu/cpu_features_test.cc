#include "kernels/cpu/cpu_features.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels::cpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

CpuFeatures Avx2Only() {
  CpuFeatures f;
  f.sse4_2 = f.avx = f.avx2 = f.fma = f.f16c = true;
  return f;
}

CpuFeatures Avx512Full() {
  CpuFeatures f = Avx2Only();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512_bf16 = true;
  return f;
}

TEST(CpuFeaturesTest, DetectionAgreesWithTheCompilerRuntime) {
  const CpuFeatures& f = HostCpuFeatures();
#if defined(__x86_64__)
  EXPECT_EQ(f.avx2, static_cast<bool>(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma, static_cast<bool>(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx512f, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw, static_cast<bool>(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512vl, static_cast<bool>(__builtin_cpu_supports("avx512vl")));
  EXPECT_FALSE(f.vendor.empty());
#endif
  EXPECT_GE(f.logical_cpus, 1);
  EXPECT_EQ(&HostCpuFeatures(), &HostCpuFeatures());
}

TEST(CpuFeaturesTest, BaselineCpuGetsScalarWithReasons) {
  CpuFeatures f;  // nothing
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kScalar);
  EXPECT_THAT(SupportedCpuIsas(f), ElementsAre(CpuIsa::kScalar));
  EXPECT_EQ(WhyNotCpuIsa(CpuIsa::kScalar, f), std::nullopt);
  EXPECT_THAT(
      WhyNotCpuIsa(CpuIsa::kAvx2, f),
      Optional(std::string("avx2 kernels need avx2 fma f16c; this CPU lacks avx2 fma f16c")));
  EXPECT_EQ(f.FeatureList(), "none");
}

TEST(CpuFeaturesTest, Avx2WithoutAvx512) {
  CpuFeatures f = Avx2Only();
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx2);
  EXPECT_THAT(SupportedCpuIsas(f), ElementsAre(CpuIsa::kScalar, CpuIsa::kAvx2));
  EXPECT_THAT(WhyNotCpuIsa(CpuIsa::kAvx512, f),
              Optional(HasSubstr("this CPU lacks avx512f avx512bw avx512vl avx512dq")));
  EXPECT_EQ(f.FeatureList(), "sse4.2 avx avx2 fma f16c");
}

TEST(CpuFeaturesTest, PartialAvx512IsNotEnough) {
  CpuFeatures f = Avx512Full();
  f.avx512bw = false;  // e.g. Knights Landing
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx2);
  EXPECT_THAT(WhyNotCpuIsa(CpuIsa::kAvx512, f), Optional(HasSubstr("lacks avx512bw")));
}

TEST(CpuFeaturesTest, FullAvx512) {
  CpuFeatures f = Avx512Full();
  EXPECT_EQ(BestCpuIsa(f), CpuIsa::kAvx512);
  EXPECT_THAT(f.FeatureList(), HasSubstr("avx512_bf16"));
}

TEST(CpuFeaturesTest, IsaNamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    EXPECT_EQ(ParseCpuIsa(CpuIsaName(isa)).value(), isa);
  }
  EXPECT_EQ(ParseCpuIsa("sse2").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::kernels::cpu
