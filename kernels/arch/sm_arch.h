// SmArch: a CUDA compute capability as an ordered (major, minor) pair, and the
// reviewed capability table that says what each known architecture can do.
//
// Every feature decision in the kernel registry reads this table; nothing
// compares raw integers like `major * 10 + minor >= 90` elsewhere. An
// architecture missing from the table (a GPU newer than this build) is
// "unknown": it gets only portable PTX-based candidates, with a warning.
//
// Thread-safety: plain values and a constant table.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::kernels::arch {

struct SmArch {
  int major = 0;
  int minor = 0;

  auto operator<=>(const SmArch&) const = default;

  std::string ToString() const;  // "9.0"
  std::string SmName() const;    // "sm_90"
};

// "9.0", "90" or "sm_90" -> SmArch; nullopt otherwise.
std::optional<SmArch> ParseSmArch(std::string_view text);

// What an architecture offers that kernels may depend on. Features that also
// need an arch-specific code image (wgmma needs sm_90a) say so in the
// candidate's rule, not here: this is what the silicon has.
struct ArchCapabilities {
  SmArch arch;
  std::string_view family;             // "Ampere", "Hopper", ...
  std::string_view examples;           // "A100", "H100, H200", ...
  bool bf16_mma = false;               // mma.sync bf16 (8.0+)
  bool fp8_mma = false;                // fp8 tensor-core MMA (8.9+)
  bool cp_async = false;               // cp.async global->shared copies (8.0+)
  bool wgmma = false;                  // warpgroup MMA (9.0, with an sm_90a image)
  bool tma = false;                    // tensor memory accelerator bulk copies (9.0+)
  bool tcgen05 = false;                // 5th-gen tensor cores + tensor memory (10.x datacenter)
  bool thread_block_clusters = false;  // 9.0+
};

// The reviewed table, ascending by arch.
const std::vector<ArchCapabilities>& CapabilityTable();

// The row for `arch`, or nullopt when this build does not know the arch.
std::optional<ArchCapabilities> CapabilitiesOf(SmArch arch);

// Oldest architecture the CUDA backend supports (bf16 tensor cores).
inline constexpr SmArch kMinCudaArch{8, 0};

}  // namespace tessera::kernels::arch
