// P2pAllReduce: a one-shot all-reduce for small and medium messages between
// the GPUs of one process, through peer-to-peer (NVLink) stores instead of
// NCCL.
//
// The message is cut into slices, one CTA each (16 KiB per CTA, 1 to 32
// CTAs). CTA c of a rank pushes its slice into every peer's inbox with
// 16-byte stores, fences, writes a flag into each peer's memory, waits for
// the peers' flags in its own memory, then sums all ranks' copies of the
// slice in rank order (fp32, so every rank gets bitwise the same result)
// into data. Pushing instead of pulling means no NVLink round trip per load:
// the only waits are the fence and one flag. The call is enqueued on the
// rank's stream, needs no host synchronisation, can be captured into CUDA
// graphs (round counters live in device memory). Inbox halves
// alternate by round parity, which makes one barrier per call enough.
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
  std::vector<DeviceBuffer> inbox_;   // per rank: [2][8 senders][max_count] bf16
  std::vector<DeviceBuffer> flags_;   // per rank: [32 CTAs][8 senders] uint32 written by peers
  std::vector<DeviceBuffer> state_;   // per rank: 32 round counters, then the timeouts
  std::vector<DeviceBuffer> tables_;  // per rank: staging and flag pointers of every rank
};

}  // namespace tessera::kernels::cuda
