// AllowDependentLaunch: the device side of programmatic dependent launch
// for the kernels whose successor may start early. Included by .cu files.
#pragma once

namespace tessera::kernels::cuda {

// Lets the next kernel on the stream start before this one ends when it
// is launched as a programmatic dependent (gemv.h's staged GEMV, which
// copies its weights while this kernel runs and waits for this kernel's
// results with griddepcontrol.wait). A no-op for other launches and before
// SM 9.0. Kernels call it first thing.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace tessera::kernels::cuda
