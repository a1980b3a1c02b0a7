// Preflight of the CUDA kernels: before any weights load, every CUDA kernel
// the registry chose runs on tiny odd-sized inputs on the device and is
// compared with the CPU reference (kernels/cpu/reference_ops.h; the MoE
// routing and experts with kernels/cpu/moe_*.h). A failure
// (a launch error such as "no kernel image is available", or a wrong result)
// comes back as FAILED_PRECONDITION naming the device, its compute
// capability, the binary's code images, the driver and runtime versions, the
// op and the cause, and what to do about it.
//
// Thread-safety: uses the calling thread's current device; call from one
// thread at start-up.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/registry.h"

namespace tessera::runner {

// REQUIRES: device.kind == kCuda with gpu info; `report` selected for it.
absl::Status PreflightCudaKernels(const kernels::DeviceDescription& device,
                                  const kernels::SelectionReport& report);

}  // namespace tessera::runner
