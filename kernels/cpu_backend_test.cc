#include "kernels/cpu_backend.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels {
namespace {

using ::testing::HasSubstr;

TEST(CpuBackendTest, OptimizedKernelsPassPreflightAtEveryIsa) {
  cpu::ThreadPool pool(3);
  for (cpu::CpuIsa isa : cpu::SupportedCpuIsas(cpu::HostCpuFeatures())) {
    for (cpu::ThreadPool* p : {static_cast<cpu::ThreadPool*>(nullptr), &pool}) {
      absl::Status s = PreflightCpuKernels(OptimizedCpuKernels(), cpu::CpuContext{p, isa});
      EXPECT_TRUE(s.ok()) << cpu::CpuIsaName(isa) << ": " << s;
    }
  }
}

TEST(CpuBackendTest, ReferenceKernelsPassPreflight) {
  EXPECT_TRUE(PreflightCpuKernels(ReferenceCpuKernels(), cpu::CpuContext{}).ok());
}

TEST(CpuBackendTest, TablesNameTheirBackend) {
  for (Op op : kAllOps) {
    EXPECT_EQ(OptimizedCpuKernels().BackendOf(op), "cpu");
    EXPECT_EQ(ReferenceCpuKernels().BackendOf(op), "cpu_reference");
  }
  EXPECT_NE(OptimizedCpuKernels().gemm, ReferenceCpuKernels().gemm);
}

// A broken GEMM: writes zeros.
void ZeroGemm(const cpu::CpuContext&, const float*, int64_t m, const cpu::WeightMatrix& w,
              const float*, float* y) {
  std::fill(y, y + m * w.rows, 0.0f);
}

TEST(CpuBackendTest, PreflightCatchesAWrongKernelAndNamesIt) {
  CpuKernels broken = OptimizedCpuKernels();
  broken.gemm = &ZeroGemm;
  absl::Status s = PreflightCpuKernels(broken, cpu::CpuContext{nullptr, cpu::CpuIsa::kScalar});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("preflight: gemm (gemm m=1) on backend cpu isa=scalar"));
  EXPECT_THAT(s.message(), HasSubstr("differs from cpu_reference"));
}

TEST(CpuBackendTest, KernelsFollowTheSelectionPerOp) {
  absl::StatusOr<SelectionReport> report =
      BuiltinRegistry().SelectAll(HostCpuDevice(), {{"norm_backend", "cpu_reference"}});
  ASSERT_TRUE(report.ok()) << report.status();
  absl::StatusOr<CpuKernels> k = CpuKernelsFor(*report);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->rms_norm, ReferenceCpuKernels().rms_norm);
  EXPECT_EQ(k->fused_add_rms_norm, ReferenceCpuKernels().fused_add_rms_norm);
  EXPECT_EQ(k->embedding, ReferenceCpuKernels().embedding);
  EXPECT_EQ(k->rope, ReferenceCpuKernels().rope);
  EXPECT_EQ(k->silu_mul, ReferenceCpuKernels().silu_mul);
  EXPECT_EQ(k->gemm, OptimizedCpuKernels().gemm);
  EXPECT_EQ(k->attention_decode, OptimizedCpuKernels().attention_decode);
  EXPECT_EQ(k->argmax, OptimizedCpuKernels().argmax);
  EXPECT_EQ(k->BackendOf(Op::kRmsNorm), "cpu_reference");
  EXPECT_EQ(k->BackendOf(Op::kGemm), "cpu");
  EXPECT_TRUE(PreflightCpuKernels(*k, CpuContextFor(HostCpuDevice(), nullptr)).ok());
}

TEST(CpuBackendTest, NonCpuChoiceIsRejected) {
  absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(HostCpuDevice());
  ASSERT_TRUE(report.ok());
  report->selections[0].chosen = "cuda_cublas";
  absl::StatusOr<CpuKernels> k = CpuKernelsFor(*report);
  EXPECT_EQ(k.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(k.status().message(), HasSubstr("not a CPU backend"));
  report->selections.pop_back();
  report->selections[0].chosen = "cpu";
  EXPECT_FALSE(CpuKernelsFor(*report).ok());  // all_reduce missing
}

TEST(CpuBackendTest, ContextFollowsTheDescribedCpu) {
  DeviceDescription d = HostCpuDevice();
  EXPECT_EQ(CpuContextFor(d, nullptr).isa, cpu::BestCpuIsa(cpu::HostCpuFeatures()));
  d.cpu.avx512f = false;
  EXPECT_NE(CpuContextFor(d, nullptr).isa, cpu::CpuIsa::kAvx512);
  d.cpu.avx2 = false;
  EXPECT_EQ(CpuContextFor(d, nullptr).isa, cpu::CpuIsa::kScalar);
  EXPECT_THAT(CpuBackendDetails(d), HasSubstr("scalar kernels (avx2 kernels need"));
}

}  // namespace
}  // namespace tessera::kernels
