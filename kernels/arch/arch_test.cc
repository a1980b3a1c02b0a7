#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/arch/build_manifest.h"
#include "kernels/arch/sm_arch.h"

namespace tessera::kernels::arch {
namespace {

using ::testing::HasSubstr;

TEST(SmArchTest, OrderedAsPairsNotAsDecimals) {
  EXPECT_LT((SmArch{8, 9}), (SmArch{9, 0}));
  EXPECT_LT((SmArch{9, 0}), (SmArch{10, 0}));  // "10.0" < "9.0" as strings
  EXPECT_LT((SmArch{10, 3}), (SmArch{11, 0}));
  EXPECT_LT((SmArch{12, 0}), (SmArch{12, 1}));
  EXPECT_EQ((SmArch{12, 1}).ToString(), "12.1");
  EXPECT_EQ((SmArch{12, 1}).SmName(), "sm_121");
}

TEST(SmArchTest, Parse) {
  EXPECT_EQ(ParseSmArch("9.0"), (SmArch{9, 0}));
  EXPECT_EQ(ParseSmArch("sm_90"), (SmArch{9, 0}));
  EXPECT_EQ(ParseSmArch("120"), (SmArch{12, 0}));
  EXPECT_EQ(ParseSmArch("103"), (SmArch{10, 3}));
  EXPECT_FALSE(ParseSmArch(""));
  EXPECT_FALSE(ParseSmArch("9"));
  EXPECT_FALSE(ParseSmArch("9.x"));
  EXPECT_FALSE(ParseSmArch("sm_9a"));
}

TEST(CapabilityTableTest, SortedUniqueAndFeaturesMonotoneWhereTheyMustBe) {
  const auto& table = CapabilityTable();
  ASSERT_FALSE(table.empty());
  for (size_t i = 1; i < table.size(); ++i) EXPECT_LT(table[i - 1].arch, table[i].arch);
  for (const ArchCapabilities& row : table) {
    EXPECT_TRUE(row.bf16_mma) << row.arch.ToString();
    EXPECT_EQ(row.fp8_mma, row.arch >= (SmArch{8, 9})) << row.arch.ToString();
    EXPECT_EQ(row.wgmma, row.arch == (SmArch{9, 0})) << row.arch.ToString();
    EXPECT_EQ(row.tcgen05, row.arch.major == 10) << row.arch.ToString();
  }
  EXPECT_FALSE(CapabilitiesOf({13, 0}));
  EXPECT_FALSE(CapabilitiesOf({7, 5}));
  EXPECT_EQ(CapabilitiesOf({9, 0})->family, "Hopper");
}

TEST(ManifestTest, ParsesTheArchList) {
  auto m = ManifestFromArchList("sm_80;sm_90a;sm_100f;compute_120", 13000);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->images.size(), 4u);
  EXPECT_EQ(m->ImageList(), "sm_80, sm_90a, sm_100f, compute_120");
  EXPECT_EQ(m->images[1].suffix, 'a');
  EXPECT_TRUE(m->images[3].ptx);
  EXPECT_FALSE(ManifestFromArchList("sm_80;gfx90a", 13000));
  EXPECT_FALSE(ManifestFromArchList("sm_80x", 13000));
}

TEST(ManifestTest, ThisBuildMatchesItsConfiguration) {
  const BuildManifest& m = ThisBuildManifest();
#if TESSERA_TEST_EXPECT_CUDA
  EXPECT_TRUE(m.cuda_built);
  EXPECT_FALSE(m.images.empty());
  EXPECT_GE(m.toolkit_version, 12000);
  EXPECT_FALSE(m.nvcc_version.empty());
#else
  EXPECT_FALSE(m.cuda_built);
  EXPECT_TRUE(m.images.empty());
#endif
}

TEST(ImageRulesTest, RunsOn) {
  const CodeImage sm80{{8, 0}, '\0', false}, sm90a{{9, 0}, 'a', false}, sm100f{{10, 0}, 'f', false},
      ptx120{{12, 0}, '\0', true}, ptx90a{{9, 0}, 'a', true};
  EXPECT_TRUE(sm80.RunsOn({8, 6}));
  EXPECT_TRUE(sm80.RunsOn({8, 9}));
  EXPECT_FALSE(sm80.RunsOn({9, 0}));  // SASS never crosses a major version
  EXPECT_TRUE(sm90a.RunsOn({9, 0}));
  EXPECT_FALSE(sm90a.RunsOn({10, 0}));
  EXPECT_TRUE(sm100f.RunsOn({10, 3}));
  EXPECT_FALSE(sm100f.RunsOn({11, 0}));
  EXPECT_FALSE(sm100f.RunsOn({12, 0}));
  EXPECT_TRUE(ptx120.RunsOn({13, 0}));  // PTX JITs forward
  EXPECT_FALSE(ptx120.RunsOn({10, 0}));
  EXPECT_FALSE(ptx90a.RunsOn({10, 0}));
}

TEST(ImageRulesTest, DriverOlderThanToolkit) {
  auto m = ManifestFromArchList("sm_90a;compute_90", 13000);
  ASSERT_TRUE(m);
  ImageMatch match = FindImage(*m, {9, 0}, 12080);
  EXPECT_EQ(match.kind, ImageKind::kNone);
  EXPECT_THAT(match.note, HasSubstr("driver supports CUDA 12.8"));
  EXPECT_THAT(match.note, HasSubstr("needs CUDA 13.x"));
  // Minor-version compatibility: SASS from 13.1 runs on a 13.0 driver, PTX does not JIT.
  auto newer = ManifestFromArchList("sm_90a;compute_120", 13010);
  EXPECT_EQ(FindImage(*newer, {9, 0}, 13000).kind, ImageKind::kSass);
  ImageMatch ptx = FindImage(*newer, {12, 0}, 13000);
  EXPECT_EQ(ptx.kind, ImageKind::kNone);
  EXPECT_THAT(ptx.note, HasSubstr("older than the toolkit"));
  EXPECT_EQ(FindImage(*newer, {12, 0}, 13010).kind, ImageKind::kPtxJit);
}

TEST(ImageRulesTest, PrefersNewestSassThenPtx) {
  auto m = ManifestFromArchList("compute_80;sm_80;sm_86", 13000);
  ImageMatch match = FindImage(*m, {8, 9}, 13000);
  EXPECT_EQ(match.kind, ImageKind::kSass);
  EXPECT_EQ(match.image->Name(), "sm_86");
  match = FindImage(*m, {9, 0}, 13000);
  EXPECT_EQ(match.kind, ImageKind::kPtxJit);
  EXPECT_EQ(match.image->Name(), "compute_80");
  EXPECT_THAT(match.note, HasSubstr("degraded"));
}

TEST(ImageRulesTest, NoCudaBuild) {
  ImageMatch match = FindImage(BuildManifest{}, {9, 0}, 13000);
  EXPECT_EQ(match.kind, ImageKind::kNone);
  EXPECT_THAT(match.note, HasSubstr("-DTESSERA_CUDA=ON"));
}

}  // namespace
}  // namespace tessera::kernels::arch
