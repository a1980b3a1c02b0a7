// What the registry knows about the device a model runs on. Today a CPU
// description; GPU fields (compute capability as an ordered SmArch, memory,
// shared memory per block, driver/runtime versions) join when kernels/arch
// adds CUDA device detection. Candidates' why_not() read only this struct,
// so fake devices in tests exercise every selection rule.
//
// Thread-safety: plain values; HostCpuDevice() is safe from any thread.
#pragma once

#include <string>
#include <string_view>

#include "kernels/cpu/cpu_features.h"

namespace tessera::kernels {

enum class DeviceKind { kCpu, kCuda };

std::string_view DeviceKindName(DeviceKind kind);  // "cpu", "cuda"

struct DeviceDescription {
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;   // index among devices of this kind
  std::string name;  // e.g. the CPU brand string or "NVIDIA H200"
  // The host CPU. Always filled: host-side work runs there whatever `kind` is.
  // Tests may clear flags to describe a lesser CPU; the cpu backend then
  // reports and uses the matching ISA level.
  cpu::CpuFeatures cpu;

  // e.g. "cpu:0 AMD EPYC 9654 (2 logical CPUs; features: sse4.2 avx avx2 fma f16c ...)".
  std::string Summary() const;
};

// The host CPU as a device, from HostCpuFeatures().
DeviceDescription HostCpuDevice();

}  // namespace tessera::kernels
