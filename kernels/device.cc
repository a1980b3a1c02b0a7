#include "kernels/device.h"

#include "absl/strings/str_cat.h"

namespace tessera::kernels {

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::string DeviceDescription::Summary() const {
  std::string out = absl::StrCat(std::string(DeviceKindName(kind)), ":", ordinal);
  if (!name.empty()) absl::StrAppend(&out, " ", name);
  absl::StrAppend(&out, " (host CPU: ", cpu.logical_cpus,
                  " logical CPUs; features: ", cpu.FeatureList(), ")");
  return out;
}

DeviceDescription HostCpuDevice() {
  DeviceDescription d;
  d.kind = DeviceKind::kCpu;
  d.ordinal = 0;
  d.cpu = cpu::HostCpuFeatures();
  d.name = d.cpu.brand.empty() ? "host CPU" : d.cpu.brand;
  return d;
}

}  // namespace tessera::kernels
