// NcclGroup: NCCL communicators for the GPUs of one process (one rank per
// device, created together with ncclCommInitAll), and the collectives a
// tensor-parallel forward pass needs, enqueued on the rank's stream (no host
// synchronisation; capturable into CUDA graphs).
//
// NVLink SHARP / multicast stays off: the caller's environment keeps
// NCCL_NVLS_ENABLE=0 (Create() sets it when unset, before NCCL reads it).
//
// Thread-safety: Create() from one thread; afterwards rank r's calls must
// come from one thread with rank r's device current (the ranks' threads call
// concurrently, each on its own communicator).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

class NcclGroup {
 public:
  enum class DType { kBf16, kF32 };

  // One communicator per CUDA ordinal, rank i on ordinals[i].
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(const std::vector<int>& ordinals);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }

  // In place: data[i] = sum over ranks. Every rank calls with the same count.
  absl::Status AllReduceSum(int rank, void* data, int64_t count, DType dtype, CudaStream stream);

  // "2.28.3" (the library loaded at run time).
  static std::string Version();

 private:
  NcclGroup() = default;
  std::vector<void*> comms_;  // ncclComm_t
};

}  // namespace tessera::kernels::cuda
