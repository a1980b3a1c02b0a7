// What the CUDA runtime reports about this machine's GPUs: driver and
// runtime versions and, per device (keyed by PCI bus id), its name, compute
// capability, SM count, shared memory and global memory. Only this folder
// includes CUDA headers; callers see plain structs.
//
// Thread-safety: QueryCudaDevices() is safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::kernels::cuda {

struct CudaDeviceInfo {
  int ordinal = -1;        // CUDA ordinal in this process (not an identity).
  std::string pci_bus_id;  // e.g. "0000:18:00.0": the device's identity.
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  int64_t shared_memory_per_block_optin = 0;
  int64_t total_memory_bytes = 0;
  bool exclusive_process = false;  // compute mode: one process's context at a time
};

struct CudaSystemInfo {
  int driver_version = 0;   // e.g. 13000 for 13.0; 0 when no driver is loaded.
  int runtime_version = 0;  // The runtime this binary was linked with.
  std::vector<CudaDeviceInfo> devices;
};

// Queries the driver. No driver or no device is not an error: the result
// has driver_version 0 or no devices, and `note` says why.
struct CudaQueryResult {
  CudaSystemInfo info;
  std::string note;
};
CudaQueryResult QueryCudaDevices();

// What the runtime says about this binary's code on device `ordinal`:
// cudaFuncGetAttributes on a probe kernel compiled with the same -gencode
// list as every Tessera kernel. `loadable` false with the runtime's error
// when no image runs there (e.g. "no kernel image is available").
struct ImageProbeResult {
  bool loadable = false;
  int binary_version = 0;  // arch of the SASS the runtime loaded (e.g. 90)
  int ptx_version = 0;     // virtual arch of the PTX in the image, 0 if none
  std::string error;
};
ImageProbeResult ProbeImage(int ordinal);

// Free and total memory of the current device (cudaMemGetInfo); false on error.
bool CurrentDeviceMemory(size_t* free_bytes, size_t* total_bytes);

// Whether every ordered pair of `ordinals` can access each other's memory
// (cudaDeviceCanAccessPeer); false on any error.
bool AllPeersAccessible(const std::vector<int>& ordinals);

}  // namespace tessera::kernels::cuda
