#include "kernels/cpu/cpu_features.h"

#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TESSERA_X86 1
#endif

namespace tessera::kernels::cpu {
namespace {

#ifdef TESSERA_X86
struct CpuidRegs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs Cpuid(uint32_t leaf, uint32_t subleaf) {
  CpuidRegs r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool Bit(uint32_t value, int bit) { return (value >> bit) & 1u; }

// XCR0: which register states the OS saves on context switches.
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t{edx} << 32) | eax;
}
#endif

int LogicalCpus() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace

std::string CpuFeatures::FeatureList() const {
  std::vector<std::string> names;
  const std::pair<bool, std::string_view> flags[] = {
      {sse4_2, "sse4.2"},     {avx, "avx"},
      {avx2, "avx2"},         {fma, "fma"},
      {f16c, "f16c"},         {avx512f, "avx512f"},
      {avx512bw, "avx512bw"}, {avx512vl, "avx512vl"},
      {avx512dq, "avx512dq"}, {avx512_bf16, "avx512_bf16"},
  };
  for (const auto& [present, name] : flags) {
    if (present) names.emplace_back(name);
  }
  return names.empty() ? std::string("none") : absl::StrJoin(names, " ");
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  f.logical_cpus = LogicalCpus();
#ifdef TESSERA_X86
  const CpuidRegs leaf0 = Cpuid(0, 0);
  const uint32_t max_leaf = leaf0.eax;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &leaf0.ebx, 4);
  std::memcpy(vendor + 4, &leaf0.edx, 4);
  std::memcpy(vendor + 8, &leaf0.ecx, 4);
  f.vendor = vendor;

  if (Cpuid(0x80000000u, 0).eax >= 0x80000004u) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const CpuidRegs r = Cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i + 0, &r.eax, 4);
      std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &r.edx, 4);
    }
    std::string b = brand;
    const size_t first = b.find_first_not_of(' ');
    const size_t last = b.find_last_not_of(' ');
    f.brand = first == std::string::npos ? "" : b.substr(first, last - first + 1);
  }

  if (max_leaf < 1) return f;
  const CpuidRegs leaf1 = Cpuid(1, 0);
  f.sse4_2 = Bit(leaf1.ecx, 20);
  const bool osxsave = Bit(leaf1.ecx, 27);
  const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;              // SSE and AVX state
  const bool os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  f.avx = os_ymm && Bit(leaf1.ecx, 28);
  f.fma = f.avx && Bit(leaf1.ecx, 12);
  f.f16c = f.avx && Bit(leaf1.ecx, 29);
  if (max_leaf < 7) return f;
  const CpuidRegs leaf7 = Cpuid(7, 0);
  f.avx2 = f.avx && Bit(leaf7.ebx, 5);
  f.avx512f = os_zmm && Bit(leaf7.ebx, 16);
  f.avx512dq = f.avx512f && Bit(leaf7.ebx, 17);
  f.avx512bw = f.avx512f && Bit(leaf7.ebx, 30);
  f.avx512vl = f.avx512f && Bit(leaf7.ebx, 31);
  if (leaf7.eax >= 1) f.avx512_bf16 = f.avx512f && Bit(Cpuid(7, 1).eax, 5);
#endif
  return f;
}

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures* features = new CpuFeatures(DetectCpuFeatures());
  return *features;
}

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown CPU ISA level \"", std::string(name),
                                                 "\"; valid: scalar, avx2, avx512"));
}

std::optional<std::string> WhyNotCpuIsa(CpuIsa isa, const CpuFeatures& f) {
  std::vector<std::pair<bool, std::string_view>> needs;
  switch (isa) {
    case CpuIsa::kScalar:
      return std::nullopt;
    case CpuIsa::kAvx2:
      needs = {{f.avx2, "avx2"}, {f.fma, "fma"}, {f.f16c, "f16c"}};
      break;
    case CpuIsa::kAvx512:
      needs = {{f.avx2, "avx2"},        {f.fma, "fma"},           {f.f16c, "f16c"},
               {f.avx512f, "avx512f"},  {f.avx512bw, "avx512bw"}, {f.avx512vl, "avx512vl"},
               {f.avx512dq, "avx512dq"}};
      break;
  }
  std::vector<std::string> all, missing;
  for (const auto& [present, name] : needs) {
    all.emplace_back(name);
    if (!present) missing.emplace_back(name);
  }
  if (missing.empty()) return std::nullopt;
  return absl::StrCat(std::string(CpuIsaName(isa)), " kernels need ", absl::StrJoin(all, " "),
                      "; this CPU lacks ", absl::StrJoin(missing, " "));
}

CpuIsa BestCpuIsa(const CpuFeatures& features) { return SupportedCpuIsas(features).back(); }

std::vector<CpuIsa> SupportedCpuIsas(const CpuFeatures& features) {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!WhyNotCpuIsa(isa, features)) out.push_back(isa);
  }
  return out;
}

}  // namespace tessera::kernels::cpu
