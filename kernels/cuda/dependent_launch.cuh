// Programmatic dependent launch (SM 9.0+): a kernel launched with
// LaunchDependent may start while the kernel before it on the stream still
// runs, once that kernel calls AllowDependentLaunch (or its CTAs exit), and
// must call WaitForPrimary before it reads what that kernel writes or
// writes what it reads. Work before the wait (loads of constant weights,
// of buffers older kernels wrote, launch latency) overlaps the end of the
// kernel before. Included by .cu files.
//
// "Older kernels" needs care: a dependent kernel that calls
// AllowDependentLaunch before its own WaitForPrimary (the staged GEMV, the
// RMSNorms) lets the kernel after it start while the kernel before it may
// still run. A kernel that reads buffers before its wait (the p2p
// all-reduce + RMSNorm: the residual, the call state, the inbox it
// re-marks; FusedAddRmsNorm: the residual) must therefore be preceded,
// somewhere between it and the last writer of those buffers, by a kernel
// that is launched normally or waits before it allows dependents. The
// decode step keeps that: the all-reduce after the staged o_proj follows
// attention, a normal launch after the previous all-reduce's consumers.
// Launching the tiled GEMV as a dependent too (loading its first weights
// before the wait) broke the tensor-parallel tests (TP=2 logits far from
// TP=1) while it still allowed dependents at entry: with one-wave grids
// every CTA of the staged gate/up and then of the down GEMV let its
// successor start at once, so the next all-reduce could read its call
// state and re-mark inbox slots before the previous one had finished.
// Allowing them only after its wait, with decode attention, Rope and
// SiLU-mul launched as dependents that wait at entry, passed every CUDA
// test on 2 x H200 but made steps slower, in the same run: TP=2 batch-1
// graph steps 3.45 ms against 2.65, TP=1 4.41 against 4.32-4.35, TP=2
// batch 64 3.57 against 3.51-3.53. In the batch-1 trace the down GEMV,
// attention and the all-reduces each took 15-30 us more per call; not
// traced further. At batch 64 the ~0.45 us gap a TP=2 step shows before
// Rope, attention and SiLU-mul only moved into their own time. Reverted.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/per_device.cuh"

namespace tessera::kernels::cuda {

// Lets the next kernel on the stream start before this one ends when it
// is launched as a programmatic dependent (gemv.h's staged GEMV, the p2p
// all-reduce + RMSNorm, FusedAddRmsNorm). A no-op for other launches and
// before SM 9.0.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the kernel before this one on the stream has completed and
// its writes are visible; returns at once when this kernel was not
// launched as a programmatic dependent. A no-op before SM 9.0 (where no
// launch is programmatic).
__device__ __forceinline__ void WaitForPrimary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether the current device takes programmatic dependent launches (SM
// 9.0+), found once per device.
inline bool DependentLaunchSupported() {
  static PerDevice<bool> supported;
  const bool* v = supported.Current([](bool& yes, int dev) {
    int major = 0;
    yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
          major >= 9;
    cudaGetLastError();
  });
  return v != nullptr && *v;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic
// dependent of the kernel before it when `programmatic` (the device takes
// such launches: the caller knows), else as a normal launch. The kernel
// must call WaitForPrimary (see above).
template <class... Params, class... Args>
cudaError_t LaunchDependentIf(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// LaunchDependentIf where the current device supports it.
template <class... Params, class... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  return LaunchDependentIf(DependentLaunchSupported(), kernel, grid, block, smem, stream,
                           std::forward<Args>(args)...);
}

}  // namespace tessera::kernels::cuda
