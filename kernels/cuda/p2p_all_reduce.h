// P2pAllReduce: a one-shot all-reduce for small messages between the GPUs of
// one process, through peer-to-peer (NVLink) loads instead of NCCL.
//
// Each rank copies its data into its own staging buffer, tells every peer
// (a flag written into the peer's memory), waits for all peers' flags, then
// sums every rank's staging buffer in rank order (so all ranks get bitwise
// the same result) into its data. One CTA per rank; the call is enqueued on
// the rank's stream, needs no host synchronisation and can be captured into
// CUDA graphs (the round counter lives in device memory). Staging is double
// buffered by round parity, which makes one barrier per call enough: a rank
// reuses a half only after every peer has entered the next round.
//
// REQUIRES: every rank makes the same sequence of calls with the same
// counts (lockstep ranks); count <= max_count. A rank whose peers never
// arrive gives up after a bounded wait and counts a timeout (Timeouts()).
//
// Thread-safety: Create() from one thread; afterwards rank r's calls from
// one thread with rank r's device current.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::kernels::cuda {

class P2pAllReduce {
 public:
  // One rank per CUDA ordinal; FAILED_PRECONDITION when two devices cannot
  // access each other's memory.
  static absl::StatusOr<std::unique_ptr<P2pAllReduce>> Create(const std::vector<int>& ordinals,
                                                              int64_t max_count);

  int size() const { return static_cast<int>(ordinals_.size()); }
  int64_t max_count() const { return max_count_; }

  // In place: data[i] = sum over ranks (bf16 values, fp32 sum, rank order).
  absl::Status AllReduceSumBf16(int rank, Bf16* data, int64_t count, CudaStream stream);

  // Calls of `rank` that stopped waiting for a peer (0 when healthy).
  absl::StatusOr<uint32_t> Timeouts(int rank);

 private:
  P2pAllReduce() = default;
  std::vector<int> ordinals_;
  int64_t max_count_ = 0;
  std::vector<DeviceBuffer> staging_;  // per rank: 2 x max_count bf16
  std::vector<DeviceBuffer> flags_;    // per rank: [size] uint32 written by peers
  std::vector<DeviceBuffer> state_;    // per rank: {round, timeouts} uint32
  std::vector<DeviceBuffer> tables_;   // per rank: staging and flag pointers of every rank
};

}  // namespace tessera::kernels::cuda
