// Table tests of CUDA backend selection with fake devices and fake builds:
// every arch Tessera knows (and one it does not), binaries with and without a
// matching code image, and drivers older and newer than the toolkit. No GPU
// needed: candidates read only the DeviceDescription.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/arch/build_manifest.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"

namespace tessera::kernels {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kDefaultArchs[] = "sm_80;sm_86;sm_89;sm_90a;sm_100a;sm_120;compute_120";
constexpr char kNo120Archs[] = "sm_80;sm_86;sm_89;sm_90a;sm_100a";

arch::BuildManifest Build(const char* archs, int toolkit = 13000) {
  std::optional<arch::BuildManifest> m = arch::ManifestFromArchList(archs, toolkit);
  EXPECT_TRUE(m) << archs;
  return m.value_or(arch::BuildManifest{});
}

DeviceDescription FakeGpu(arch::SmArch sm, const arch::BuildManifest& build, int driver = 13000) {
  DeviceDescription d;
  d.kind = DeviceKind::kCuda;
  d.ordinal = 0;
  d.name = "Fake GPU " + sm.ToString();
  GpuInfo gpu;
  gpu.pci_bus_id = "0000:18:00.0";
  gpu.arch = sm;
  gpu.sm_count = 100;
  gpu.shared_memory_per_block_optin = 227 << 10;
  gpu.total_memory_bytes = int64_t{80} << 30;
  gpu.driver_version = driver;
  gpu.runtime_version = build.toolkit_version;
  d.gpu = gpu;
  d.build = build;
  return d;
}

struct Row {
  arch::SmArch sm;
  const char* archs;
  int driver;
  // Expected: "sass:<image>", "ptx:<image>" or "error".
  std::string expect;
  std::vector<std::string> message;  // substrings of the details (ok) or the error
};

class SelectionTableTest : public ::testing::TestWithParam<Row> {};

TEST_P(SelectionTableTest, ChoiceAndMessages) {
  const Row& row = GetParam();
  DeviceDescription device = FakeGpu(row.sm, Build(row.archs), row.driver);
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(device);
  if (row.expect == "error") {
    ASSERT_FALSE(report.ok()) << report->ToTable();
    EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(report.status().message(), HasSubstr("no backend can run attention_decode"));
    for (const std::string& s : row.message) EXPECT_THAT(report.status().message(), HasSubstr(s));
    // An explicit choice of the CUDA attention backend is a hard error with the same reason.
    absl::StatusOr<SelectionReport> forced =
        BuiltinRegistry().SelectAll(device, {{"attention_backend", "cuda"}});
    ASSERT_FALSE(forced.ok());
    EXPECT_EQ(forced.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(forced.status().message(), HasSubstr("--attention_backend=cuda cannot run"));
    for (const std::string& s : row.message) EXPECT_THAT(forced.status().message(), HasSubstr(s));
    return;
  }
  ASSERT_TRUE(report.ok()) << report.status();
  const Selection* attention = report->Find(Op::kAttentionDecode);
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->chosen, "cuda");
  EXPECT_EQ(report->Find(Op::kGemm)->chosen, "cublas");
  EXPECT_EQ(report->Find(Op::kAllReduce)->chosen, "single_rank");
  const std::string table = report->ToTable();
  const bool sass = row.expect.rfind("sass:", 0) == 0;
  const std::string image = row.expect.substr(row.expect.find(':') + 1);
  EXPECT_THAT(attention->why, HasSubstr((sass ? "SASS " : "PTX ") + image)) << table;
  if (!sass) {
    EXPECT_THAT(attention->why, HasSubstr("degraded")) << table;
  }
  for (const std::string& s : row.message) EXPECT_THAT(attention->why, HasSubstr(s)) << table;
  // The CPU candidates are rejected on a GPU with the reason: no silent host fallback.
  ASSERT_FALSE(attention->rejected.empty());
  EXPECT_EQ(attention->rejected[0].name, "cpu");
  EXPECT_THAT(attention->rejected[0].reason, HasSubstr("host CPU"));
}

INSTANTIATE_TEST_SUITE_P(
    FakeDevices, SelectionTableTest,
    ::testing::Values(
        // The default build on every arch.
        Row{{8, 0}, kDefaultArchs, 13000, "sass:sm_80", {}},
        Row{{8, 6}, kDefaultArchs, 13000, "sass:sm_86", {}},
        Row{{8, 9}, kDefaultArchs, 13000, "sass:sm_89", {}},
        Row{{9, 0}, kDefaultArchs, 13000, "sass:sm_90a", {}},
        Row{{10, 0}, kDefaultArchs, 13000, "sass:sm_100a", {}},
        // sm_100a is arch-specific: a B300 (10.3) cannot run it, and PTX 12.0 is newer.
        Row{{10, 3},
            kDefaultArchs,
            13000,
            "error",
            {"no code image for SM 10.3", "sm_100a", "compute_120", "sm_103",
             "-DTESSERA_CUDA_ARCHS"}},
        Row{{11, 0}, kDefaultArchs, 13000, "error", {"no code image for SM 11.0", "sm_110"}},
        Row{{12, 0}, kDefaultArchs, 13000, "sass:sm_120", {}},
        Row{{12, 1}, kDefaultArchs, 13000, "sass:sm_120", {}},  // same major, newer minor
        // A future arch: only the PTX path, with a warning.
        Row{{13, 0},
            kDefaultArchs,
            13000,
            "ptx:compute_120",
            {"warning: SM 13.0 is newer than this build's capability table"}},
        // A binary without sm_120 SASS and compute_120 PTX on an SM 12.0 device.
        Row{{12, 0},
            kNo120Archs,
            13000,
            "error",
            {"no code image for SM 12.0", "SASS: sm_80, sm_86, sm_89, sm_90a, sm_100a", "PTX: none",
             "sm_120 (SASS) or compute_120 (PTX)", "-DTESSERA_CUDA_ARCHS"}},
        Row{{13, 0}, kNo120Archs, 13000, "error", {"no code image for SM 13.0", "compute_XY PTX"}},
        Row{{9, 0}, kNo120Archs, 13000, "sass:sm_90a", {}},
        // A build for one arch family only.
        Row{{8, 9}, "sm_80", 13000, "sass:sm_80", {}},
        Row{{9, 0}, "sm_80", 13000, "error", {"no code image for SM 9.0", "SASS: sm_80"}},
        // PTX-only builds JIT everywhere later, degraded.
        Row{{9, 0}, "compute_80", 13000, "ptx:compute_80", {"no SASS for SM 9.0"}},
        Row{{12, 1}, "compute_80", 13010, "ptx:compute_80", {}},
        // Drivers: older major than the toolkit fails everything, whatever the images.
        Row{{9, 0},
            kDefaultArchs,
            12080,
            "error",
            {"driver supports CUDA 12.8", "needs CUDA 13.x", "580"}},
        Row{{12, 0}, kDefaultArchs, 12090, "error", {"driver supports CUDA 12.9"}},
        // A newer driver than the toolkit is fine.
        Row{{9, 0}, kDefaultArchs, 13020, "sass:sm_90a", {}}));

TEST(CudaSelectionTest, OlderThanSm80IsRejected) {
  DeviceDescription t4 = FakeGpu({7, 5}, Build(kDefaultArchs));
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(t4);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("needs SM 8.0 or newer"));
  EXPECT_THAT(report.status().message(), HasSubstr("is SM 7.5"));
}

TEST(CudaSelectionTest, BinaryWithoutCuda) {
  DeviceDescription gpu = FakeGpu({9, 0}, arch::BuildManifest{});
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("built without the CUDA backend"));
  EXPECT_THAT(report.status().message(), HasSubstr("-DTESSERA_CUDA=ON"));
}

TEST(CudaSelectionTest, NoDriverLoaded) {
  DeviceDescription gpu = FakeGpu({9, 0}, Build(kDefaultArchs), /*driver=*/0);
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("no CUDA driver is loaded"));
}

TEST(CudaSelectionTest, ProbeDisagreeingWithTheManifestIsReported) {
  DeviceDescription gpu = FakeGpu({9, 0}, Build(kDefaultArchs));
  gpu.gpu->probe =
      GpuInfo::Probe{false, 0, 0, "cudaErrorNoKernelImageForDevice: no kernel image is available"};
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(),
              AllOf(HasSubstr("could not load this binary's kernels"),
                    HasSubstr("no kernel image is available"), HasSubstr("sm_90a")));
  gpu.gpu->probe = GpuInfo::Probe{true, 90, 0, ""};
  report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->Find(Op::kRope)->why, HasSubstr("runtime loaded binary 90"));
}

TEST(CudaSelectionTest, CpuDeviceRejectsCudaCandidatesWithReason) {
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(HostCpuDevice());
  ASSERT_TRUE(report.ok()) << report.status();
  const Selection* gemm = report->Find(Op::kGemm);
  EXPECT_EQ(gemm->chosen, "cpu");
  ASSERT_FALSE(gemm->rejected.empty());
  EXPECT_EQ(gemm->rejected[0].name, "cublas");
  EXPECT_THAT(gemm->rejected[0].reason, HasSubstr("needs a CUDA device"));
  // Asking for CUDA on a CPU is an error, never a fallback.
  absl::StatusOr<SelectionReport> forced =
      BuiltinRegistry().SelectAll(HostCpuDevice(), {{"gemm_backend", "cublas"}});
  ASSERT_FALSE(forced.ok());
  EXPECT_THAT(forced.status().message(), HasSubstr("needs a CUDA device"));
}

TEST(CudaSelectionTest, TensorParallelGroupNeedsARealCollective) {
  DeviceDescription gpu = FakeGpu({9, 0}, Build(kDefaultArchs));
  gpu.tensor_parallel_size = 2;
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok()) << report.status();
  const Selection* all_reduce = report->Find(Op::kAllReduce);
  EXPECT_EQ(all_reduce->chosen, "nccl");
  EXPECT_THAT(all_reduce->why, HasSubstr("NCCL all-reduce over 2 GPUs"));
  // One rank: nothing to reduce, and NCCL says so.
  gpu.tensor_parallel_size = 1;
  report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->Find(Op::kAllReduce)->chosen, "single_rank");
  EXPECT_EQ(report->Find(Op::kAllReduce)->rejected[0].reason, "one rank: nothing to reduce");
}

// The peer-to-peer all-reduce is chosen only when every pair of the group's
// GPUs reaches the other's memory (measured when the group is resolved), and
// only up to 8 ranks; NCCL otherwise. Forcing it where it cannot run is an
// error naming the reason.
TEST(CudaSelectionTest, PeerToPeerAllReduceNeedsPeerAccess) {
  DeviceDescription gpu = FakeGpu({9, 0}, Build(kDefaultArchs));
  gpu.tensor_parallel_size = 2;
  gpu.tensor_parallel_peer_access = true;
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->Find(Op::kAllReduce)->chosen, "p2p");
  EXPECT_THAT(report->Find(Op::kAllReduce)->why, HasSubstr("NCCL above"));

  gpu.tensor_parallel_peer_access = false;
  report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->Find(Op::kAllReduce)->chosen, "nccl");
  EXPECT_THAT(report->Find(Op::kAllReduce)->rejected[0].reason, HasSubstr("no P2P path"));
  absl::StatusOr<SelectionReport> forced =
      BuiltinRegistry().SelectAll(gpu, {{"all_reduce_backend", "p2p"}});
  ASSERT_FALSE(forced.ok());
  EXPECT_THAT(forced.status().message(), HasSubstr("no P2P path"));

  gpu.tensor_parallel_peer_access = true;
  gpu.tensor_parallel_size = 16;
  report = BuiltinRegistry().SelectAll(gpu);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->Find(Op::kAllReduce)->chosen, "nccl");
  EXPECT_THAT(report->Find(Op::kAllReduce)->rejected[0].reason, HasSubstr("at most 8 ranks"));
}

// Arch-specific kernels: a registry like the built-in one with an sm_100a-only
// (tcgen05) and an sm_90a-only (wgmma) candidate ahead of the portable one.
Registry ArchSpecificRegistry() {
  Registry r;
  auto add = [&](std::string name, arch::SmArch sm, const char* feature) {
    EXPECT_TRUE(r.Add(Candidate{name,
                                Op::kAttentionPrefill,
                                [sm, feature](const DeviceDescription& d) {
                                  return ArchSpecificWhyNot(d, sm, 'a', feature);
                                },
                                {}})
                    .ok());
  };
  add("tcgen05", {10, 0}, "tcgen05 attention");
  add("wgmma", {9, 0}, "wgmma attention");
  EXPECT_TRUE(r.Add(Candidate{"cuda", Op::kAttentionPrefill, &CudaKernelsWhyNot, {}}).ok());
  return r;
}

TEST(ArchSpecificTest, EachArchGetsOnlyWhatItCanRun) {
  const Registry r = ArchSpecificRegistry();
  struct Case {
    arch::SmArch sm;
    const char* chosen;
  };
  for (Case c : {Case{{9, 0}, "wgmma"}, Case{{10, 0}, "tcgen05"}, Case{{12, 0}, "cuda"},
                 Case{{12, 1}, "cuda"}, Case{{8, 9}, "cuda"}, Case{{13, 0}, "cuda"}}) {
    absl::StatusOr<Selection> s =
        r.Select(Op::kAttentionPrefill, FakeGpu(c.sm, Build(kDefaultArchs)));
    ASSERT_TRUE(s.ok()) << c.sm.ToString() << ": " << s.status();
    EXPECT_EQ(s->chosen, c.chosen) << c.sm.ToString();
  }
  // SM 12.0 never gets the SM100-only kernel, and the report says why.
  absl::StatusOr<Selection> s =
      r.Select(Op::kAttentionPrefill, FakeGpu({12, 0}, Build(kDefaultArchs)));
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->rejected[0].reason,
              AllOf(HasSubstr("tcgen05 attention needs SM 10.0 exactly"), HasSubstr("SM 12.0")));
  // Forcing it is an error naming the reason.
  absl::StatusOr<Selection> forced =
      r.Select(Op::kAttentionPrefill, FakeGpu({12, 0}, Build(kDefaultArchs)), "tcgen05",
               "attention_backend");
  ASSERT_FALSE(forced.ok());
  EXPECT_THAT(forced.status().message(), HasSubstr("needs SM 10.0 exactly"));
}

TEST(ArchSpecificTest, MissingArchSpecificImageNamesTheRebuild) {
  const Registry r = ArchSpecificRegistry();
  // A Hopper with a build carrying plain sm_90 (no 'a'): portable kernels only.
  absl::StatusOr<Selection> s =
      r.Select(Op::kAttentionPrefill, FakeGpu({9, 0}, Build("sm_80;sm_90;compute_90")));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->chosen, "cuda");
  EXPECT_THAT(s->rejected[1].reason, AllOf(HasSubstr("needs sm_90a code, which this binary lacks"),
                                           HasSubstr("sm_90a in -DTESSERA_CUDA_ARCHS")));
  EXPECT_THAT(s->rejected[1].reason, Not(HasSubstr("tcgen05")));
}

// FP8 linears (Op::kFp8Gemm, kernels/cuda_fp8_backend.h) per architecture:
// SM 8.0 / 8.6 have no FP8 tensor cores and dequantize; Hopper takes
// cuBLASLt's block-scaled FP8 GEMM (its own wgmma kernels, so with or
// without this binary's sm_90a image); 8.9, 10.0 and 12.0 have FP8 MMA but
// cuBLASLt's 128-block scaling is Hopper-only and Tessera has no mma.sync
// e4m3 GEMM yet, so they dequantize too, and the details say why.
struct Fp8Row {
  arch::SmArch sm;
  const char* archs;
  int toolkit;
  std::string chosen;
  std::vector<std::string> why;           // substrings of the chosen candidate's details
  std::vector<std::string> rejected_why;  // substrings of the first rejection
};

class Fp8SelectionTableTest : public ::testing::TestWithParam<Fp8Row> {};

TEST_P(Fp8SelectionTableTest, ChoiceAndReasons) {
  const Fp8Row& row = GetParam();
  absl::StatusOr<SelectionReport> report =
      BuiltinRegistry().SelectAll(FakeGpu(row.sm, Build(row.archs, row.toolkit)));
  ASSERT_TRUE(report.ok()) << report.status();
  const Selection* fp8 = report->Find(Op::kFp8Gemm);
  ASSERT_NE(fp8, nullptr);
  EXPECT_EQ(fp8->chosen, row.chosen) << report->ToTable();
  for (const std::string& s : row.why) EXPECT_THAT(fp8->why, HasSubstr(s)) << report->ToTable();
  ASSERT_FALSE(fp8->rejected.empty());
  for (const std::string& s : row.rejected_why) {
    EXPECT_THAT(fp8->rejected[0].reason, HasSubstr(s)) << report->ToTable();
  }
  // The CPU candidates are rejected with their reason; no host fallback.
  EXPECT_EQ(fp8->rejected.back().name, "cpu_reference");
  EXPECT_THAT(report->ToTable(), HasSubstr("fp8_gemm"));
}

INSTANTIATE_TEST_SUITE_P(
    FakeDevices, Fp8SelectionTableTest,
    ::testing::Values(
        Fp8Row{{8, 0},
               kDefaultArchs,
               13000,
               "cuda-fp8-dequant",
               {"SM 8.0 has no FP8 tensor cores, so prefill dequantizes to bf16", "FP8 GEMV"},
               {"Hopper (SM 9.x) only", "SM 8.0, which has no FP8 tensor cores"}},
        Fp8Row{{8, 6},
               kDefaultArchs,
               13000,
               "cuda-fp8-dequant",
               {"SM 8.6 has no FP8 tensor cores"},
               {"SM 8.6, which has no FP8 tensor cores"}},
        Fp8Row{{8, 9},
               kDefaultArchs,
               13000,
               "cuda-fp8-dequant",
               {"no mma.sync e4m3 GEMM yet", "Hopper (SM 9.x) only"},
               {"the device is SM 8.9"}},
        Fp8Row{{10, 0},
               kDefaultArchs,
               13000,
               "cuda-fp8-dequant",
               {"no mma.sync e4m3 GEMM yet"},
               {"the device is SM 10.0"}},
        Fp8Row{{12, 0},
               kDefaultArchs,
               13000,
               "cuda-fp8-dequant",
               {"no mma.sync e4m3 GEMM yet"},
               {"the device is SM 12.0"}},
        // Hopper with the sm_90a image, and with plain sm_90 code: cuBLASLt
        // brings its own wgmma kernels either way.
        Fp8Row{{9, 0},
               kDefaultArchs,
               13000,
               "cublaslt-fp8-block",
               {"cuBLASLt FP8 GEMM (Hopper wgmma kernels)", "per-token-group-128", "SASS sm_90a"},
               {"lower priority than cublaslt-fp8-block"}},
        Fp8Row{{9, 0},
               "sm_80;sm_90;compute_90",
               13000,
               "cublaslt-fp8-block",
               {"SASS sm_90"},
               {"lower priority than cublaslt-fp8-block"}},
        // A binary built with a toolkit older than cuBLASLt's block scaling.
        Fp8Row{{9, 0},
               kDefaultArchs,
               12080,
               "cuda-fp8-dequant",
               {"needs CUDA 12.9 or newer"},
               {"needs CUDA 12.9 or newer; this binary was built with CUDA 12.8"}}));

// The built-in wgmma prefill candidate: chosen for attention_prefill on SM
// 9.0 when the binary carries sm_90a code, never elsewhere, and never a
// value of --attention_backend (it covers prefill only).
TEST(CudaSm90aPrefillTest, ChosenOnlyOnSm90WithAnSm90aImage) {
  absl::StatusOr<SelectionReport> report =
      BuiltinRegistry().SelectAll(FakeGpu({9, 0}, Build(kDefaultArchs)));
  ASSERT_TRUE(report.ok()) << report.status();
  const Selection* prefill = report->Find(Op::kAttentionPrefill);
  EXPECT_EQ(prefill->chosen, "cuda-sm90a");
  EXPECT_THAT(prefill->why, AllOf(HasSubstr("wgmma flash attention"), HasSubstr("SASS sm_90a")));
  EXPECT_EQ(prefill->rejected[0].name, "cuda");
  EXPECT_EQ(prefill->rejected[0].reason, "lower priority than cuda-sm90a");
  EXPECT_EQ(report->Find(Op::kAttentionDecode)->chosen, "cuda");

  // SM 9.0 with plain sm_90 code (no 'a'): the portable kernel, and why.
  report = BuiltinRegistry().SelectAll(FakeGpu({9, 0}, Build("sm_80;sm_90;compute_90")));
  ASSERT_TRUE(report.ok()) << report.status();
  prefill = report->Find(Op::kAttentionPrefill);
  EXPECT_EQ(prefill->chosen, "cuda");
  ASSERT_FALSE(prefill->rejected.empty());
  EXPECT_EQ(prefill->rejected[0].name, "cuda-sm90a");
  EXPECT_THAT(prefill->rejected[0].reason,
              AllOf(HasSubstr("wgmma prefill attention needs sm_90a code, which this binary lacks"),
                    HasSubstr("sm_90a in -DTESSERA_CUDA_ARCHS")));

  // Other archs: the portable kernel.
  for (arch::SmArch sm : {arch::SmArch{8, 0}, arch::SmArch{8, 9}, arch::SmArch{10, 0},
                          arch::SmArch{12, 0}, arch::SmArch{12, 1}}) {
    report = BuiltinRegistry().SelectAll(FakeGpu(sm, Build(kDefaultArchs)));
    ASSERT_TRUE(report.ok()) << sm.ToString() << ": " << report.status();
    prefill = report->Find(Op::kAttentionPrefill);
    EXPECT_EQ(prefill->chosen, "cuda") << sm.ToString();
    EXPECT_THAT(prefill->rejected[0].reason,
                AllOf(HasSubstr("wgmma prefill attention needs SM 9.0 exactly"),
                      HasSubstr("the device is SM " + sm.ToString())))
        << sm.ToString();
  }

  // --attention_backend=cuda keeps prefill on the portable kernel; the
  // prefill-only candidate is not a value of the family flag.
  report = BuiltinRegistry().SelectAll(FakeGpu({9, 0}, Build(kDefaultArchs)),
                                       {{"attention_backend", "cuda"}});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->Find(Op::kAttentionPrefill)->chosen, "cuda");
  EXPECT_THAT(report->Find(Op::kAttentionPrefill)->rejected[0].reason,
              HasSubstr("not requested (--attention_backend=cuda)"));
  EXPECT_THAT(KnownBackends("attention_backend"), Not(::testing::Contains("cuda-sm90a")));
  EXPECT_FALSE(ValidateBackendOverride("attention_backend", "cuda-sm90a").ok());
}

}  // namespace
}  // namespace tessera::kernels

namespace tessera::kernels {
namespace {

// Device selectors: malformed ones and impossible groups are errors that say
// what would work; on a machine without GPUs, asking for one names why.
TEST(DeviceSelectorTest, BadSelectorsAndGroups) {
  absl::StatusOr<DeviceDescription> d = ResolveDevice("gpu0");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("expected cpu, cuda"));
  EXPECT_TRUE(ResolveDevice("cpu").ok());

  absl::StatusOr<std::vector<DeviceDescription>> cpu_ranks = ResolveDevices("cpu", 3);
  ASSERT_TRUE(cpu_ranks.ok()) << cpu_ranks.status();
  ASSERT_EQ(cpu_ranks->size(), 3u);
  for (const DeviceDescription& r : *cpu_ranks) EXPECT_EQ(r.tensor_parallel_size, 3);
  EXPECT_FALSE(ResolveDevices("cpu", 0).ok());

  absl::StatusOr<std::vector<DeviceDescription>> mismatch =
      ResolveDevices("cuda:0000:18:00.0,0000:19:00.0", 3);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("names 2 GPUs but --tensor_parallel_size=3"));

  if (DetectCudaDevices().devices.empty()) {
    absl::StatusOr<std::vector<DeviceDescription>> two = ResolveDevices("cuda", 2);
    ASSERT_FALSE(two.ok());
    EXPECT_THAT(two.status().message(),
                HasSubstr("--tensor_parallel_size=2 needs 2 GPUs; 0 visible"));
    absl::StatusOr<DeviceDescription> one = ResolveDevice("cuda:0000:18:00.0");
    ASSERT_FALSE(one.ok());
    EXPECT_EQ(one.status().code(), absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace tessera::kernels
