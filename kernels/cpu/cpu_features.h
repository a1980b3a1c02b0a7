// What the host CPU can execute, and which kernel instruction set (ISA
// level) the optimized CPU kernels use on it.
//
// The binary is built for baseline x86-64; the SIMD kernels are compiled
// per function for AVX2 and AVX-512 and chosen at run time from these
// features, so the same binary runs on any x86-64 machine.
//
// ISA levels of the optimized kernels:
//   kAvx512  needs avx512f, avx512bw, avx512vl, avx512dq (and the AVX2 set)
//   kAvx2    needs avx2, fma, f16c
//   kScalar  portable C++, always available
// avx512_bf16 is detected and reported but not used: its dot product rounds
// the fp32 activations to bf16, which the fp32 contract of the kernels forbids.
//
// Thread-safety: HostCpuFeatures() is computed once and is safe from any
// thread; everything else is pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::kernels::cpu {

struct CpuFeatures {
  std::string vendor;  // e.g. "AuthenticAMD"
  std::string brand;   // e.g. "AMD EPYC 9654 96-Core Processor"
  int logical_cpus = 1;
  bool sse4_2 = false;
  bool avx = false;  // includes OS support for the YMM state
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // includes OS support for the ZMM and opmask state
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;

  // Space-separated names of the present features, e.g. "sse4.2 avx avx2 fma".
  std::string FeatureList() const;
};

// Reads cpuid and xgetbv on x86-64; every flag false elsewhere.
CpuFeatures DetectCpuFeatures();

// Detected once per process.
const CpuFeatures& HostCpuFeatures();

enum class CpuIsa { kScalar, kAvx2, kAvx512 };

std::string_view CpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512"
absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// Empty when `features` can run kernels of level `isa`; otherwise the reason,
// e.g. "avx512 kernels need avx512f avx512bw avx512vl avx512dq; this CPU lacks avx512bw".
std::optional<std::string> WhyNotCpuIsa(CpuIsa isa, const CpuFeatures& features);

// The highest level `features` supports.
CpuIsa BestCpuIsa(const CpuFeatures& features);

// Every level `features` supports, lowest first (always starts with kScalar).
std::vector<CpuIsa> SupportedCpuIsas(const CpuFeatures& features);

}  // namespace tessera::kernels::cpu
