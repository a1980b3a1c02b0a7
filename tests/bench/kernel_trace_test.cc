// The parts of the kernel tracer that need no GPU: name shortening, the
// per-step breakdown of a timeline, and Collect before Enable.
#include "tests/bench/kernel_trace.h"

#include <gtest/gtest.h>

namespace tessera::bench {
namespace {

TEST(ShortKernelNameTest, DemanglesAndDropsNamespacesAndParameters) {
  // void tessera::kernels::cuda::(anonymous namespace)::Gemv<8, true>(float const*, int)
  EXPECT_EQ(ShortKernelName("_ZN7tessera7kernels4cuda12_GLOBAL__N_14GemvILi8ELb1EEEvPKfi"),
            "Gemv<8, true>");
  // void tessera::Kernel(int)
  EXPECT_EQ(ShortKernelName("_ZN7tessera6KernelEi"), "Kernel");
  EXPECT_EQ(ShortKernelName("sm90_xmma_gemm_bf16bf16"), "sm90_xmma_gemm_bf16bf16");
  EXPECT_EQ(ShortKernelName(nullptr), "?");
  EXPECT_EQ(ShortKernelName(std::string(200, 'k').c_str()).size(), 96u);
}

TEST(KernelTraceTest, CollectBeforeEnableIsAnError) {
  EXPECT_EQ(KernelTrace::Collect(0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SummarizeKernelsTest, SplitsBusyTimeAndGapsPerDevice) {
  // Device 0, two steps: a (0-10 us), b (12-20), host wait, a (100-110), b (112-120).
  // Device 1: one kernel (5-25 us) overlapping another (10-32 us) on a second stream.
  const std::vector<KernelRecord> records = {
      {"a", 0, 0, 10000},       {"b", 0, 12000, 20000}, {"a", 0, 100000, 110000},
      {"b", 0, 112000, 120000}, {"c", 1, 5000, 25000},  {"d", 1, 10000, 32000},
  };
  const nlohmann::json s = SummarizeKernels(records, /*steps=*/2, /*top=*/1, /*long_gap_us=*/20);
  ASSERT_EQ(s.size(), 2u);
  const nlohmann::json& d0 = s[0];
  EXPECT_EQ(d0["device"], 0);
  EXPECT_DOUBLE_EQ(d0["kernels_per_step"], 2.0);
  EXPECT_DOUBLE_EQ(d0["span_us_per_step"], 60.0);
  EXPECT_DOUBLE_EQ(d0["busy_us_per_step"], 18.0);
  EXPECT_DOUBLE_EQ(d0["short_gap_us_per_step"], 2.0);  // two 2 us gaps over 2 steps
  EXPECT_DOUBLE_EQ(d0["long_gap_us_per_step"], 40.0);  // the 80 us wait
  ASSERT_EQ(d0["kernels"].size(), 2u);                 // top 1, then the rest
  EXPECT_EQ(d0["kernels"][0]["name"], "a");
  EXPECT_DOUBLE_EQ(d0["kernels"][0]["us_per_step"], 10.0);
  EXPECT_DOUBLE_EQ(d0["kernels"][0]["us_per_call"], 10.0);
  EXPECT_DOUBLE_EQ(d0["kernels"][0]["gap_after_us_per_step"], 2.0);  // a -> b, twice
  EXPECT_EQ(d0["kernels"][1]["name"], "(others)");
  EXPECT_DOUBLE_EQ(d0["kernels"][1]["us_per_step"], 8.0);
  const nlohmann::json& d1 = s[1];
  EXPECT_DOUBLE_EQ(d1["busy_us_per_step"], 13.5);  // the union, 5-32 us, over 2 steps
  EXPECT_DOUBLE_EQ(d1["short_gap_us_per_step"], 0.0);
  EXPECT_EQ(d1["kernels"][0]["name"], "d");
}

}  // namespace
}  // namespace tessera::bench
