// What the registry knows about the device a model runs on: the host CPU
// always; for a GPU, its identity (PCI bus id), compute capability as an
// ordered SmArch, memory, shared memory per block, driver and runtime
// versions and what the runtime said when probed; and the build's manifest
// of code images. Candidates' why_not() read only this struct, so fake
// devices (and fake builds) in tests exercise every selection rule.
//
// Thread-safety: plain values; HostCpuDevice() is safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include <cstdint>
#include <optional>

#include "kernels/arch/build_manifest.h"
#include "kernels/arch/sm_arch.h"
#include "kernels/cpu/cpu_features.h"

namespace tessera::kernels {

enum class DeviceKind { kCpu, kCuda };

std::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda"

// A CUDA device as detected (kernels/cuda_devices.h) or described by a test.
struct GpuInfo {
  std::string pci_bus_id;  // "0000:18:00.0": the device's identity
  arch::SmArch arch;
  int sm_count = 0;
  int64_t shared_memory_per_block_optin = 0;
  int64_t total_memory_bytes = 0;
  // Compute mode EXCLUSIVE_PROCESS: while this process holds a context on
  // the device, no other process can make one (so no preflight child).
  bool exclusive_process = false;
  int driver_version = 0;   // CUDA version the driver supports, 13000 = 13.0
  int runtime_version = 0;  // CUDA runtime linked into this binary
  // What cudaFuncGetAttributes said about this build's probe kernel on the
  // device; absent when not probed (fake devices, or no driver).
  struct Probe {
    bool loadable = false;
    int binary_version = 0;  // e.g. 90 for SASS built for sm_90
    int ptx_version = 0;
    std::string error;  // the runtime's error when not loadable
  };
  std::optional<Probe> probe;
};

struct DeviceDescription {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;   // index among devices of this kind (in this process; not an identity)
  std::string name;  // e.g. the CPU brand string or "NVIDIA H200"
  // The host CPU. Always filled: host-side work runs there whatever `kind` is.
  // Tests may clear flags to describe a lesser CPU; the cpu backend then
  // reports and uses the matching ISA level.
  cpu::CpuFeatures cpu;
  // Set when kind == kCuda.
  std::optional<GpuInfo> gpu;
  // The code images this binary carries (tests substitute other builds).
  arch::BuildManifest build = arch::ThisBuildManifest();
  // Ranks of the tensor-parallel group this device belongs to.
  int tensor_parallel_size = 1;
  // Every pair of the group's GPUs can access each other's memory
  // (cudaDeviceCanAccessPeer), measured when the group is resolved.
  bool tensor_parallel_peer_access = false;

  // e.g. "cpu:0 AMD EPYC 9654 (2 logical CPUs; features: sse4.2 avx avx2 fma f16c ...)",
  // "cuda:0000:18:00.0 NVIDIA H200 (SM 9.0, 132 SMs, 140 GiB, driver CUDA 13.0)".
  std::string Summary() const;
};

// The host CPU as a device, from HostCpuFeatures().
DeviceDescription HostCpuDevice();

}  // namespace tessera::kernels
