#include <cuda_runtime.h>

#include "kernels/cuda/device_query.h"

namespace tessera::kernels::cuda {
namespace {

// Never launched: cudaFuncGetAttributes on it tells which image loads.
__global__ void ImageProbeKernel(int* out) {
  if (out != nullptr) *out = 1;
}

}  // namespace

bool CurrentDeviceMemory(size_t* free_bytes, size_t* total_bytes) {
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
}

ImageProbeResult ProbeImage(int ordinal) {
  ImageProbeResult r;
  // The caller's current device stays current (a runner probing the GPUs
  // while it loads must not move its allocations to another one).
  int previous = -1;
  const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
  cudaError_t err = cudaSetDevice(ordinal);
  if (err == cudaSuccess) {
    cudaFuncAttributes attr{};
    err = cudaFuncGetAttributes(&attr, ImageProbeKernel);
    if (err == cudaSuccess) {
      r.loadable = true;
      r.binary_version = attr.binaryVersion;
      r.ptx_version = attr.ptxVersion;
    }
  }
  if (!r.loadable) {
    r.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
  }
  if (had_device) cudaSetDevice(previous);
  return r;
}

CudaQueryResult QueryCudaDevices() {
  CudaQueryResult result;
  cudaRuntimeGetVersion(&result.info.runtime_version);
  if (cudaDriverGetVersion(&result.info.driver_version) != cudaSuccess ||
      result.info.driver_version == 0) {
    result.info.driver_version = 0;
    result.note = "no NVIDIA driver is loaded on this machine";
    return result;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    result.note = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
    return result;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.ordinal = i;
    char bus[32] = {0};
    cudaDeviceGetPCIBusId(bus, sizeof(bus), i);
    d.pci_bus_id = bus;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.sm_count = prop.multiProcessorCount;
    d.shared_memory_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
    d.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    int mode = cudaComputeModeDefault;
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, i) != cudaSuccess) cudaGetLastError();
    d.exclusive_process = mode == cudaComputeModeExclusiveProcess;
    result.info.devices.push_back(d);
  }
  if (count == 0) result.note = "the driver reports no CUDA device";
  return result;
}

bool AllPeersAccessible(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) {
        cudaGetLastError();
        return false;
      }
    }
  }
  return true;
}

}  // namespace tessera::kernels::cuda
