// P2pAllReduce: a one-shot all-reduce for small and medium messages between
// the GPUs of one process, through peer-to-peer (NVLink) stores instead of
// NCCL, optionally fused with the residual add and RMSNorm that follow
// every all-reduce of a decoder layer.
//
// Protocol (flagless, "Lamport" style): every rank pushes its values into
// every peer's inbox with 16-byte stores; an inbox slot holds bf16 -0.0
// (the empty marker) until the sender's value lands, and senders turn a
// -0.0 of their own into +0.0, so a receiver knows a value has arrived by
// looking at it: no fence, flag or second round trip. It then sums all
// ranks' values in rank order (fp32, rounded once to bf16: every rank gets
// bitwise the same result). Inboxes rotate over three buffers: in call r
// a rank writes its peers' buffer r % 3, reads its own buffer r % 3 and
// re-marks as empty its buffer (r - 1) % 3, which it finished reading in
// call r - 1 and which no peer writes before call r + 2. Ranks are at most
// one call apart (a call completes only once every peer has pushed), so
// the three buffers never collide. Work is split over 1 to 128 CTAs (8 KiB
// of message per CTA, or one row each for the fused form); the call counter
// and the previous call's size (for the re-marking) live in device memory
// and the last CTA of a call advances them, so calls can be captured into
// CUDA graphs and replayed, and consecutive calls may have different sizes.
//
// REQUIRES: every rank makes the same sequence of calls with the same
// sizes (lockstep ranks); count <= max_count. A rank whose peers never
// arrive gives up after about two seconds and counts a timeout
// (Timeouts(), TakeTimedOut()); its result is then wrong, never a hang.
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

  // AllReduceSumBf16(delta) then FusedAddRmsNorm(delta, residual, rows, cols,
  // w, eps, out) (kernels/cuda/rmsnorm.h) in one kernel: residual += the
  // ranks' sum of delta (rounded to bf16 first, as the all-reduce's result);
  // out = RmsNorm(residual) * w in bf16. `delta` keeps this rank's values.
  // Needs AddRmsNormSupports(); rows * cols <= max_count.
  // When every CTA takes one row (rows <= 128, cols <= 8192), the kernel is
  // launched as a programmatic dependent of the kernel before it on the
  // stream (dependent_launch.cuh) and reads `residual` and `w` before that
  // kernel ends: they must not be its outputs (delta may be).
  absl::Status AllReduceAddRmsNorm(int rank, const Bf16* delta, float* residual, int64_t rows,
                                   int64_t cols, const float* w, float eps, Bf16* out,
                                   CudaStream stream);
  // The same with residual = the ranks' sum (its old values are not read):
  // the first norm after a vocabulary-parallel embedding, whose ranks
  // contribute zeros for the ids they do not hold.
  absl::Status AllReduceRmsNorm(int rank, const Bf16* delta, float* residual, int64_t rows,
                                int64_t cols, const float* w, float eps, Bf16* out,
                                CudaStream stream);
  // cols a multiple of 8, every pointer 16-byte aligned.
  static bool AddRmsNormSupports(const Bf16* delta, const float* residual, int64_t cols,
                                 const float* w, const Bf16* out);

  // Calls of `rank` that stopped waiting for a peer (0 when healthy).
  absl::StatusOr<uint32_t> Timeouts(int rank);
  // Whether a call of `rank` stopped waiting for a peer since the last
  // TakeTimedOut(rank), which clears it: a read of host memory, no copy, so
  // callers can check after every step. Valid once the rank's calls so far
  // have ended (its stream synchronized). After a timeout the group cannot
  // be trusted again: a rank that made a call its peers did not is out of
  // step with them (every later call pairs the wrong partners), and a peer
  // that was only late pushes its values into a slot the waiting rank has
  // since marked empty again, where a later call would take them.
  bool TakeTimedOut(int rank);
  // The inbox buffer (0..2) `rank`'s next call uses: equal on every rank
  // while they are in step (a copy from the device; the rank's stream
  // must be idle).
  absl::StatusOr<uint32_t> CallIndex(int rank);

  ~P2pAllReduce();
  P2pAllReduce(const P2pAllReduce&) = delete;
  P2pAllReduce& operator=(const P2pAllReduce&) = delete;

 private:
  P2pAllReduce() = default;
  absl::Status CheckCall(int rank, int64_t count, bool null_data) const;
  // Word `word` of rank's call state, copied from its device.
  absl::StatusOr<uint32_t> StateWord(int rank, int word);
  absl::Status LaunchRmsNorm(int rank, const Bf16* delta, float* residual, int64_t rows,
                             int64_t cols, const float* w, float eps, Bf16* out, bool accumulate,
                             CudaStream stream);
  std::vector<int> ordinals_;
  int64_t max_count_ = 0;
  int64_t cap_ = 0;                   // max_count rounded up to 8 values
  std::vector<DeviceBuffer> inbox_;   // per rank: [3 buffers][ranks][cap] bf16
  std::vector<DeviceBuffer> state_;   // per rank: buffer index, previous size, CTAs done, timeouts
  std::vector<DeviceBuffer> tables_;  // per rank: every rank's inbox
  std::vector<uint32_t*> timed_out_;  // per rank: host-mapped "a call gave up" word
  std::vector<uint32_t*> timed_out_dev_;
};

}  // namespace tessera::kernels::cuda
