#include "kernels/arch/sm_arch.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace tessera::kernels::arch {

std::string SmArch::ToString() const { return absl::StrCat(major, ".", minor); }
std::string SmArch::SmName() const { return absl::StrCat("sm_", major, minor); }

std::optional<SmArch> ParseSmArch(std::string_view text) {
  if (text.substr(0, 3) == "sm_") text.remove_prefix(3);
  auto digits = [](std::string_view s) {
    if (s.empty()) return false;
    for (char c : s) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
  };
  const size_t dot = text.find('.');
  if (dot != std::string_view::npos) {
    std::string_view a = text.substr(0, dot), b = text.substr(dot + 1);
    if (!digits(a) || !digits(b) || a.size() > 2 || b.size() > 1) return std::nullopt;
    return SmArch{std::stoi(std::string(a)), std::stoi(std::string(b))};
  }
  if (!digits(text) || text.size() < 2 || text.size() > 3) return std::nullopt;
  // The last digit is the minor version: "90" -> 9.0, "120" -> 12.0.
  return SmArch{std::stoi(std::string(text.substr(0, text.size() - 1))), text.back() - '0'};
}

const std::vector<ArchCapabilities>& CapabilityTable() {
  // Reviewed against the CUDA C++ Programming Guide's compute capability
  // tables and the PTX ISA target notes (sm_90a: wgmma/setmaxnreg; sm_100a /
  // sm_103a: tcgen05). 8.7 (Orin), 11.0 (Thor) and 12.1 (GB10) are embedded /
  // workstation parts with the features of their family's consumer line.
  static const auto* table = new std::vector<ArchCapabilities>{
      //  arch     family       examples                    bf16  fp8    cp.a  wgmma  tma    tc05
      //  clus
      {{8, 0}, "Ampere", "A100, A30", true, false, true, false, false, false, false},
      {{8, 6}, "Ampere", "A10, A40, RTX 30xx", true, false, true, false, false, false, false},
      {{8, 7}, "Ampere", "Jetson Orin", true, false, true, false, false, false, false},
      {{8, 9}, "Ada", "L4, L40S, RTX 40xx", true, true, true, false, false, false, false},
      {{9, 0}, "Hopper", "H100, H200, GH200", true, true, true, true, true, false, true},
      {{10, 0}, "Blackwell", "B200, GB200", true, true, true, false, true, true, true},
      {{10, 3}, "Blackwell Ultra", "B300, GB300", true, true, true, false, true, true, true},
      {{11, 0}, "Blackwell (Thor)", "Jetson Thor", true, true, true, false, true, false, true},
      {{12, 0},
       "Blackwell (consumer)",
       "RTX 50xx, RTX PRO 6000",
       true,
       true,
       true,
       false,
       true,
       false,
       true},
      {{12, 1}, "Blackwell (GB10)", "DGX Spark", true, true, true, false, true, false, true},
  };
  return *table;
}

std::optional<ArchCapabilities> CapabilitiesOf(SmArch arch) {
  for (const ArchCapabilities& row : CapabilityTable()) {
    if (row.arch == arch) return row;
  }
  return std::nullopt;
}

}  // namespace tessera::kernels::arch
