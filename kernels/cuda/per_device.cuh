// State built once per device ordinal and looked up for the current
// device: what a kernel's launch needs to know about the device (its
// compute capability, a raised shared-memory limit), so that launches do
// no host work beyond one cudaGetDevice. Included by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace tessera::kernels::cuda {

template <class T>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  // The current device's T, built by init(T&, int device) on the first
  // call for that device. Null when there is no current device (*error:
  // cudaGetDevice's error, cleared) or its ordinal is kMaxDevices or more
  // (*error: cudaSuccess).
  template <class Init>
  T* Current(Init&& init, cudaError_t* error = nullptr) {
    int dev = 0;
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) cudaGetLastError();
    if (error != nullptr) *error = err;
    if (err != cudaSuccess || dev < 0 || dev >= kMaxDevices) return nullptr;
    Slot& s = slots_[dev];
    std::call_once(s.once, [&] { init(s.value, dev); });
    return &s.value;
  }

 private:
  struct Slot {
    std::once_flag once;
    T value{};
  };
  Slot slots_[kMaxDevices];
};

}  // namespace tessera::kernels::cuda
