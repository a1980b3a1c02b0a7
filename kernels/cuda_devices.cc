#include "kernels/cuda_devices.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#if TESSERA_HAVE_CUDA
#include "kernels/cuda/device_query.h"
#endif

namespace tessera::kernels {
namespace {

// PCI bus ids compare case-insensitively, with or without the 8-digit domain
// form some tools print ("00000000:18:00.0").
std::string NormalizeBusId(std::string_view id) {
  std::string s = absl::AsciiStrToLower(std::string(id));
  const size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

// Sets tensor_parallel_peer_access on every device of a CUDA group.
void MarkPeerAccess(std::vector<DeviceDescription>* group) {
  bool all = false;
#if TESSERA_HAVE_CUDA
  std::vector<int> ordinals;
  for (const DeviceDescription& d : *group) ordinals.push_back(d.ordinal);
  all = cuda::AllPeersAccessible(ordinals);
#endif
  for (DeviceDescription& d : *group) d.tensor_parallel_peer_access = all;
}

}  // namespace

DetectedCudaDevices DetectCudaDevices() {
  DetectedCudaDevices out;
#if TESSERA_HAVE_CUDA
  cuda::CudaQueryResult q = cuda::QueryCudaDevices();
  out.driver_version = q.info.driver_version;
  out.runtime_version = q.info.runtime_version;
  out.note = q.note;
  const DeviceDescription host = HostCpuDevice();
  for (const cuda::CudaDeviceInfo& info : q.info.devices) {
    DeviceDescription d = host;
    d.kind = DeviceKind::kCuda;
    d.ordinal = info.ordinal;
    d.name = info.name;
    GpuInfo gpu;
    gpu.pci_bus_id = info.pci_bus_id;
    gpu.arch = arch::SmArch{info.sm_major, info.sm_minor};
    gpu.sm_count = info.sm_count;
    gpu.shared_memory_per_block_optin = info.shared_memory_per_block_optin;
    gpu.total_memory_bytes = info.total_memory_bytes;
    gpu.exclusive_process = info.exclusive_process;
    gpu.driver_version = q.info.driver_version;
    gpu.runtime_version = q.info.runtime_version;
    cuda::ImageProbeResult probe = cuda::ProbeImage(info.ordinal);
    gpu.probe =
        GpuInfo::Probe{probe.loadable, probe.binary_version, probe.ptx_version, probe.error};
    d.gpu = gpu;
    out.devices.push_back(std::move(d));
  }
#else
  out.note = "this binary was built without the CUDA backend (TESSERA_CUDA=OFF or no nvcc)";
#endif
  return out;
}

absl::StatusOr<DeviceDescription> ResolveDevice(std::string_view selector) {
  if (selector == "cpu") return HostCpuDevice();
  if (selector != "cuda" && selector.substr(0, 5) != "cuda:") {
    return absl::InvalidArgumentError(absl::StrCat("--device=", std::string(selector),
                                                   ": expected cpu, cuda (the one visible GPU) or "
                                                   "cuda:<PCI bus id> (e.g. cuda:0000:18:00.0)"));
  }
  DetectedCudaDevices found = DetectCudaDevices();
  std::vector<std::string> listed;
  for (const DeviceDescription& d : found.devices) listed.push_back(d.Summary());
  const std::string visible = listed.empty()
                                  ? absl::StrCat("no CUDA device is visible (", found.note, ")")
                                  : absl::StrCat("visible: ", absl::StrJoin(listed, "; "));
  if (selector == "cuda") {
    if (found.devices.size() == 1) return found.devices.front();
    if (found.devices.empty()) {
      return absl::NotFoundError(absl::StrCat("--device=cuda: ", visible));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--device=cuda is ambiguous with ", found.devices.size(),
                     " GPUs; name one by PCI bus id (--device=cuda:<bus id>); ", visible));
  }
  const std::string want = NormalizeBusId(selector.substr(5));
  for (const DeviceDescription& d : found.devices) {
    if (NormalizeBusId(d.gpu->pci_bus_id) == want) return d;
  }
  return absl::NotFoundError(
      absl::StrCat("--device=", std::string(selector), ": no such GPU; ", visible));
}

absl::StatusOr<std::vector<DeviceDescription>> ResolveDevices(std::string_view selector, int n) {
  if (n < 1) return absl::InvalidArgumentError("a tensor-parallel group needs at least 1 rank");
  std::vector<DeviceDescription> out;
  if (selector == "cpu" || n == 1) {
    absl::StatusOr<DeviceDescription> d = ResolveDevice(selector);
    if (!d.ok()) return d.status();
    d->tensor_parallel_size = n;
    out.assign(n, *d);
    return out;
  }
  if (selector == "cuda") {
    DetectedCudaDevices found = DetectCudaDevices();
    std::sort(found.devices.begin(), found.devices.end(),
              [](const DeviceDescription& a, const DeviceDescription& b) {
                return NormalizeBusId(a.gpu->pci_bus_id) < NormalizeBusId(b.gpu->pci_bus_id);
              });
    if (static_cast<int>(found.devices.size()) < n) {
      std::vector<std::string> listed;
      for (const DeviceDescription& d : found.devices) listed.push_back(d.Summary());
      return absl::InvalidArgumentError(absl::StrCat(
          "--tensor_parallel_size=", n, " needs ", n, " GPUs; ", found.devices.size(), " visible",
          listed.empty() ? "" : absl::StrCat(": ", absl::StrJoin(listed, "; ")),
          found.note.empty() ? "" : absl::StrCat(" (", found.note, ")")));
    }
    found.devices.resize(n);
    for (DeviceDescription& d : found.devices) d.tensor_parallel_size = n;
    MarkPeerAccess(&found.devices);
    return found.devices;
  }
  if (selector.substr(0, 5) != "cuda:") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", std::string(selector), ": expected cpu, cuda or cuda:<bus id>,<bus id>,..."));
  }
  const std::vector<std::string> ids =
      absl::StrSplit(std::string(selector.substr(5)), ',', absl::SkipEmpty());
  if (static_cast<int>(ids.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("--device=", std::string(selector), " names ",
                                                   ids.size(),
                                                   " GPUs but --tensor_parallel_size=", n));
  }
  for (const std::string& id : ids) {
    absl::StatusOr<DeviceDescription> d = ResolveDevice(absl::StrCat("cuda:", id));
    if (!d.ok()) return d.status();
    d->tensor_parallel_size = n;
    out.push_back(*d);
  }
  MarkPeerAccess(&out);
  return out;
}

}  // namespace tessera::kernels
