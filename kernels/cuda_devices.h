// CUDA device detection for the registry: every visible GPU as a
// DeviceDescription keyed by its PCI bus id, with the driver/runtime
// versions, this build's manifest and the runtime's image probe; and the
// `--device` selector the services accept.
//
// Selectors: "cpu"; "cuda" (the one visible GPU; an error naming them all
// when there are several); "cuda:<pci bus id>" such as "cuda:0000:18:00.0"
// (the identity; CUDA ordinals change with CUDA_VISIBLE_DEVICES and are
// never used to pick a device).
//
// Thread-safety: safe from any thread (each call queries the driver).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace tessera::kernels {

struct DetectedCudaDevices {
  std::vector<DeviceDescription> devices;  // kind kCuda, gpu filled and probed
  int driver_version = 0;
  int runtime_version = 0;
  // Why the list is empty, when it is (no CUDA build, no driver, no device).
  std::string note;
};

DetectedCudaDevices DetectCudaDevices();

// The device a selector names. INVALID_ARGUMENT for a malformed selector;
// NOT_FOUND (listing the visible devices) when no device matches.
absl::StatusOr<DeviceDescription> ResolveDevice(std::string_view selector);

// The devices of a tensor-parallel group of `n` ranks, rank r on element r:
// "cuda" takes the first n visible GPUs in PCI bus id order (an error when
// fewer are visible); "cuda:<id>,<id>,..." names exactly n by bus id. Every
// description has tensor_parallel_size = n. "cpu" (CPU ranks) gives the
// host CPU n times.
absl::StatusOr<std::vector<DeviceDescription>> ResolveDevices(std::string_view selector, int n);

}  // namespace tessera::kernels
