#include "kernels/registry.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(BackendOverrideTest, AutoAndKnownNamesAreValid) {
  for (const BackendFlag& f : BackendFlags()) {
    EXPECT_TRUE(ValidateBackendOverride(f.flag, "auto").ok()) << f.flag;
    if (f.flag == "gemm_backend") {
      EXPECT_THAT(KnownBackends(f.flag), ElementsAre("cublas", "cpu", "cpu_reference"));
    } else if (f.flag == "fp8_gemm_backend") {
      EXPECT_THAT(KnownBackends(f.flag),
                  ElementsAre("cublaslt-fp8-block", "cuda-fp8-dequant", "cpu", "cpu_reference"));
    } else if (f.flag == "all_reduce_backend") {
      EXPECT_THAT(KnownBackends(f.flag),
                  ElementsAre("p2p", "nccl", "single_rank", "cpu", "cpu_reference"));
    } else {
      EXPECT_THAT(KnownBackends(f.flag), ElementsAre("cuda", "cpu", "cpu_reference")) << f.flag;
    }
    for (const std::string& name : KnownBackends(f.flag)) {
      EXPECT_TRUE(ValidateBackendOverride(f.flag, name).ok()) << f.flag << "=" << name;
    }
  }
}

TEST(BackendOverrideTest, UnknownNameIsAnErrorListingChoices) {
  absl::Status s = ValidateBackendOverride("attention_backend", "flashinfer9");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--attention_backend=flashinfer9"));
  EXPECT_THAT(s.message(), HasSubstr("valid choices: auto, cuda, cpu, cpu_reference"));
}

TEST(BackendOverrideTest, UnknownFlagIsAnError) {
  EXPECT_FALSE(ValidateBackendOverride("warp_backend", "auto").ok());
  EXPECT_THAT(KnownBackends("warp_backend"), IsEmpty());
}

TEST(OpTest, NamesRoundTripAndEveryOpHasOneFlag) {
  std::set<std::string_view> names;
  for (Op op : kAllOps) {
    EXPECT_EQ(OpFromName(OpName(op)), op);
    names.insert(OpName(op));
    const std::string_view flag = FlagOfOp(op);
    ASSERT_FALSE(flag.empty()) << OpName(op);
    EXPECT_THAT(OpsOfFlag(flag), ::testing::Contains(op));
  }
  EXPECT_EQ(names.size(), std::size(kAllOps));
  EXPECT_EQ(OpFromName("warp"), std::nullopt);
  EXPECT_THAT(OpsOfFlag("attention_backend"),
              ElementsAre(Op::kAttentionPrefill, Op::kAttentionDecode, Op::kKvCacheWrite));
  EXPECT_THAT(OpsOfFlag("sampling_backend"), ElementsAre(Op::kLogitsProcessing, Op::kSampling));
  EXPECT_THAT(OpsOfFlag("all_reduce_backend"), ElementsAre(Op::kAllReduce));
}

DeviceDescription FakeCpu() {
  DeviceDescription d;
  d.kind = DeviceKind::kCpu;
  d.name = "Fake CPU";
  d.cpu.logical_cpus = 4;
  d.cpu.avx = d.cpu.avx2 = d.cpu.fma = d.cpu.f16c = true;
  return d;
}

DeviceDescription FakeGpu() {
  DeviceDescription d = FakeCpu();
  d.kind = DeviceKind::kCuda;
  d.name = "Fake GPU";
  return d;
}

std::optional<std::string> NeedsGpu(const DeviceDescription& d) {
  if (d.kind == DeviceKind::kCuda) return std::nullopt;
  return "needs a CUDA device";
}

std::optional<std::string> NeedsCpu(const DeviceDescription& d) {
  if (d.kind == DeviceKind::kCpu) return std::nullopt;
  return "runs on the host CPU";
}

// A registry with a GPU candidate ahead of two CPU ones, for gemm only.
Registry FakeRegistry() {
  Registry r;
  EXPECT_TRUE(r.Add({"gpu_fast", Op::kGemm, &NeedsGpu, nullptr}).ok());
  EXPECT_TRUE(r.Add({"cpu", Op::kGemm, &NeedsCpu,
                     [](const DeviceDescription&) { return std::string("avx2 kernels"); }})
                  .ok());
  EXPECT_TRUE(r.Add({"cpu_reference", Op::kGemm, &NeedsCpu, nullptr}).ok());
  return r;
}

TEST(RegistryTest, AutoPicksTheFirstEligibleAndExplainsTheRest) {
  Registry r = FakeRegistry();
  absl::StatusOr<Selection> s = r.Select(Op::kGemm, FakeCpu());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->chosen, "cpu");
  EXPECT_EQ(s->why, "auto: first eligible; avx2 kernels");
  ASSERT_EQ(s->rejected.size(), 2u);
  EXPECT_EQ(s->rejected[0].name, "gpu_fast");
  EXPECT_EQ(s->rejected[0].reason, "needs a CUDA device");
  EXPECT_EQ(s->rejected[1].name, "cpu_reference");
  EXPECT_EQ(s->rejected[1].reason, "lower priority than cpu");

  absl::StatusOr<Selection> gpu = r.Select(Op::kGemm, FakeGpu());
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->chosen, "gpu_fast");
  EXPECT_EQ(gpu->rejected[0].reason, "runs on the host CPU");
}

TEST(RegistryTest, ValidOverrideWinsAndOthersAreNotRequested) {
  Registry r = FakeRegistry();
  absl::StatusOr<Selection> s = r.Select(Op::kGemm, FakeCpu(), "cpu_reference", "gemm_backend");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->chosen, "cpu_reference");
  EXPECT_EQ(s->why, "override --gemm_backend=cpu_reference");
  ASSERT_EQ(s->rejected.size(), 2u);
  EXPECT_EQ(s->rejected[0].reason, "needs a CUDA device");
  EXPECT_EQ(s->rejected[1].reason, "not requested (--gemm_backend=cpu_reference)");
}

TEST(RegistryTest, OverrideThatCannotRunIsAHardErrorWithTheReason) {
  Registry r = FakeRegistry();
  absl::StatusOr<Selection> s = r.Select(Op::kGemm, FakeCpu(), "gpu_fast", "gemm_backend");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--gemm_backend=gpu_fast cannot run gemm on cpu:0"));
  EXPECT_THAT(s.status().message(), HasSubstr("needs a CUDA device"));
  EXPECT_THAT(s.status().message(), HasSubstr("cpu (ok)"));
}

TEST(RegistryTest, UnknownOverrideIsAnErrorListingCandidates) {
  Registry r = FakeRegistry();
  absl::StatusOr<Selection> s = r.Select(Op::kGemm, FakeCpu(), "tpu", "gemm_backend");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--gemm_backend=tpu: no such backend for gemm"));
  EXPECT_THAT(s.status().message(), HasSubstr("gpu_fast (needs a CUDA device)"));
}

TEST(RegistryTest, NoEligibleCandidateFailsWithEveryReason) {
  Registry r;
  ASSERT_TRUE(r.Add({"gpu_fast", Op::kSampling, &NeedsGpu, nullptr}).ok());
  absl::StatusOr<Selection> s = r.Select(Op::kSampling, FakeCpu());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("no backend can run sampling on cpu:0 Fake CPU"));
  EXPECT_THAT(s.status().message(), HasSubstr("gpu_fast (needs a CUDA device)"));
  EXPECT_EQ(r.Select(Op::kGemm, FakeCpu()).status().code(),
            absl::StatusCode::kFailedPrecondition);  // nothing registered
}

TEST(RegistryTest, AddRejectsBadCandidates) {
  Registry r;
  EXPECT_TRUE(r.Add({"a", Op::kGemm, &NeedsCpu, nullptr}).ok());
  EXPECT_EQ(r.Add({"a", Op::kGemm, &NeedsCpu, nullptr}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.Add({"a", Op::kRope, &NeedsCpu, nullptr}).ok());  // same name, other op
  EXPECT_FALSE(r.Add({"", Op::kGemm, &NeedsCpu, nullptr}).ok());
  EXPECT_FALSE(r.Add({"auto", Op::kGemm, &NeedsCpu, nullptr}).ok());
  EXPECT_FALSE(r.Add({"b", Op::kGemm, nullptr, nullptr}).ok());
  EXPECT_EQ(r.CandidatesFor(Op::kGemm).size(), 1u);
}

TEST(BuiltinRegistryTest, HostCpuGetsTheOptimizedBackendEverywhere) {
  const DeviceDescription host = HostCpuDevice();
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(host);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->selections.size(), std::size(kAllOps));
  const std::string isa(cpu::CpuIsaName(cpu::BestCpuIsa(host.cpu)));
  for (Op op : kAllOps) {
    const Selection* s = report->Find(op);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->chosen, "cpu");
    EXPECT_THAT(s->why, HasSubstr(isa + " kernels"));
    // The CUDA candidates (rejected: not a CUDA device; all_reduce has
    // three, p2p, nccl and single_rank; attention_prefill two, cuda-sm90a
    // and cuda; fp8_gemm two, cublaslt-fp8-block and cuda-fp8-dequant), then
    // cpu_reference.
    const size_t cuda = op == Op::kAllReduce                                ? 3
                        : op == Op::kAttentionPrefill || op == Op::kFp8Gemm ? 2
                                                                            : 1;
    ASSERT_EQ(s->rejected.size(), cuda + 1);
    for (size_t i = 0; i < cuda; ++i) {
      EXPECT_THAT(s->rejected[i].reason, HasSubstr("needs a CUDA device"));
    }
    EXPECT_EQ(s->rejected[cuda].name, "cpu_reference");
  }
  const std::string table = report->ToTable();
  EXPECT_THAT(table, HasSubstr("device: cpu:0"));
  EXPECT_THAT(table, HasSubstr(host.cpu.FeatureList()));
  EXPECT_THAT(table, HasSubstr("attention_decode"));
  EXPECT_THAT(table, HasSubstr("cpu_reference (lower priority than cpu)"));
}

TEST(BuiltinRegistryTest, CpuWithoutAvx2ReportsScalarKernelsAndWhy) {
  DeviceDescription d = FakeCpu();
  d.cpu.avx2 = false;
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(d);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->Find(Op::kGemm)->why,
              HasSubstr("scalar kernels (avx2 kernels need avx2 fma f16c; this CPU lacks avx2)"));
  EXPECT_THAT(report->ToTable(), HasSubstr("features: avx fma f16c"));
}

TEST(BuiltinRegistryTest, OverridesApplyToTheirWholeFamily) {
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(
      FakeCpu(), {{"sampling_backend", "cpu_reference"}, {"gemm_backend", "auto"}});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->Find(Op::kSampling)->chosen, "cpu_reference");
  EXPECT_EQ(report->Find(Op::kLogitsProcessing)->chosen, "cpu_reference");
  EXPECT_EQ(report->Find(Op::kGemm)->chosen, "cpu");
  EXPECT_EQ(report->Find(Op::kAttentionDecode)->chosen, "cpu");
}

TEST(BuiltinRegistryTest, SelectAllReportsEveryProblemAtOnce) {
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(
      FakeCpu(), {{"warp_backend", "x"}, {"attention_backend", "flash"}});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("unknown backend flag --warp_backend"));
  EXPECT_THAT(report.status().message(),
              HasSubstr("--attention_backend=flash: no such backend for attention_prefill"));
  EXPECT_THAT(report.status().message(),
              HasSubstr("--attention_backend=flash: no such backend for kv_cache_write"));
}

TEST(BuiltinRegistryTest, GpuDeviceWithoutGpuCandidatesFailsWithReasons) {
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(FakeGpu());
  EXPECT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("no backend can run gemm on cuda:0 Fake GPU"));
  EXPECT_THAT(report.status().message(),
              HasSubstr("runs on the host CPU with host memory; the device is cuda:0"));
}

}  // namespace
}  // namespace tessera::kernels
