// The CPU backend of the kernel registry: the `cpu` (optimized, threaded,
// SIMD with run-time ISA dispatch) and `cpu_reference` (plain loops)
// candidates for every op, the function table a CPU forward pass calls
// through, and the preflight that checks chosen kernels before weights load.
//
// `cpu` is eligible on every CPU device: without AVX2 it runs its portable
// scalar code (still threaded). The ISA level it will use, and why a higher
// one is unavailable, appear in the selection report.
//
// Typical start-up of a CPU worker (errors returned as they come):
//   DeviceDescription device = HostCpuDevice();
//   absl::StatusOr<SelectionReport> report = BuiltinRegistry().SelectAll(device, overrides);
//   log report->ToTable();
//   absl::StatusOr<CpuKernels> kernels = CpuKernelsFor(*report);
//   cpu::ThreadPool pool(num_threads);
//   cpu::CpuContext ctx = CpuContextFor(device, &pool);
//   absl::Status preflight = PreflightCpuKernels(*kernels, ctx);
//   ... then load weights and call kernels->gemm(ctx, ...) and so on.
//
// Thread-safety: the tables are immutable; functions are reentrant.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8_linear.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/device.h"
#include "kernels/op.h"
#include "kernels/registry.h"

namespace tessera::kernels {

inline constexpr std::string_view kCpuBackend = "cpu";
inline constexpr std::string_view kCpuReferenceBackend = "cpu_reference";

// Adds `cpu` then `cpu_reference` for every op.
void AddCpuCandidates(Registry* registry);

// What `cpu` will run on `device`, e.g. "avx512 kernels" or
// "scalar kernels (avx2 kernels need avx2 fma f16c; this CPU lacks avx2)".
std::string CpuBackendDetails(const DeviceDescription& device);

// The CPU kernels chosen per op. Signatures and contracts are those of
// kernels/cpu/cpu_ops.h; reference entries ignore the context.
struct CpuKernels {
  absl::Status (*embedding)(const cpu::CpuContext&, const cpu::WeightMatrix&,
                            absl::Span<const int32_t>, float*);  // Op::kEmbedding
  void (*rms_norm)(const cpu::CpuContext&, const float*, const float*, int64_t, int64_t, float,
                   float*);  // Op::kRmsNorm
  void (*fused_add_rms_norm)(const cpu::CpuContext&, float*, float*, const float*, int64_t, int64_t,
                             float);  // Op::kRmsNorm
  void (*rope)(const cpu::CpuContext&, absl::Span<const int32_t>, absl::Span<const float>, int,
               float*, int, int64_t, float*, int, int64_t);  // Op::kRope
  void (*gemm)(const cpu::CpuContext&, const float*, int64_t, const cpu::WeightMatrix&,
               const float*, float*);  // Op::kGemm
  void (*silu_mul)(const cpu::CpuContext&, const float*, int64_t, int64_t,
                   float*);  // Op::kSiluMul
  absl::Status (*write_kv_cache)(const cpu::CpuContext&, const float*, int64_t, const float*,
                                 int64_t, absl::Span<const int64_t>,
                                 const cpu::PagedKvCache&);  // Op::kKvCacheWrite
  // Any batch, prefill chunks and decode tokens mixed.
  absl::Status (*attention_prefill)(const cpu::CpuContext&,
                                    const cpu::PagedAttentionArgs&);  // Op::kAttentionPrefill
  // Batches where every sequence has exactly one query token.
  absl::Status (*attention_decode)(const cpu::CpuContext&,
                                   const cpu::PagedAttentionArgs&);  // Op::kAttentionDecode
  void (*softmax)(const cpu::CpuContext&, const float*, int64_t, int64_t,
                  float*);  // Op::kLogitsProcessing
  void (*log_softmax)(const cpu::CpuContext&, const float*, int64_t, int64_t,
                      float*);  // Op::kLogitsProcessing
  void (*argmax)(const cpu::CpuContext&, const float*, int64_t, int64_t,
                 int32_t*);  // Op::kSampling
  void (*reduce_sum)(const cpu::CpuContext&, absl::Span<const float* const>, int64_t,
                     float*);  // Op::kAllReduce
  // Contracts in kernels/cpu/moe_routing.h and moe_experts.h.
  void (*moe_route)(const cpu::CpuContext&, const float*, int64_t, const cpu::MoeRoutingParams&,
                    int32_t*, float*);  // Op::kMoeRouting
  void (*moe_experts)(const cpu::CpuContext&,
                      const cpu::MoeExpertsArgs&);  // Op::kMoeExperts
  // Contract in kernels/cpu/fp8_linear.h (y with row stride ldy).
  void (*fp8_gemm)(const cpu::CpuContext&, const float*, int64_t, const cpu::Fp8WeightMatrix&,
                   const cpu::Fp8Activation&, const float*, float*,
                   int64_t);  // Op::kFp8Gemm

  // Backend name per op, indexed by static_cast<size_t>(op).
  std::array<std::string, std::size(kAllOps)> backend;
  const std::string& BackendOf(Op op) const { return backend[static_cast<size_t>(op)]; }
};

const CpuKernels& OptimizedCpuKernels();  // every op from `cpu`
const CpuKernels& ReferenceCpuKernels();  // every op from `cpu_reference`

// Each op's entries from the backend the report chose for it.
// FAILED_PRECONDITION when an op was given to a non-CPU backend or is missing.
absl::StatusOr<CpuKernels> CpuKernelsFor(const SelectionReport& report);

// A context running on `pool` at the best ISA level of device.cpu.
cpu::CpuContext CpuContextFor(const DeviceDescription& device, cpu::ThreadPool* pool);

// Runs every entry of `kernels` on tiny inputs with odd sizes and compares
// with the reference (tolerances as in kernels/cpu/cpu_ops_test.cc). INTERNAL
// naming the op, backend, ISA level and first mismatch on failure.
absl::Status PreflightCpuKernels(const CpuKernels& kernels, const cpu::CpuContext& ctx);

}  // namespace tessera::kernels
