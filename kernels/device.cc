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
  if (kind == DeviceKind::kCuda && gpu) {
    std::string out =
        absl::StrCat("cuda:", gpu->pci_bus_id.empty() ? std::to_string(ordinal) : gpu->pci_bus_id);
    if (!name.empty()) absl::StrAppend(&out, " ", name);
    absl::StrAppend(&out, " (SM ", gpu->arch.ToString(), ", ", gpu->sm_count, " SMs, ",
                    gpu->total_memory_bytes >> 30, " GiB, driver CUDA ",
                    arch::CudaVersionString(gpu->driver_version), ")");
    return out;
  }
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
