// InProcessGroup: collectives for tensor-parallel ranks that are threads of
// one process on the CPU. Ranks exchange pointers to their buffers and meet
// at barriers; no data passes through sockets or copies beyond the result.
//
// AllReduceSum (two barriers):
//   1. every rank publishes its buffer; rank 0 sizes the shared result;
//      barrier;
//   2. rank r sums slice r of the elements (n split into `size` contiguous
//      slices) over all ranks' buffers, in rank order, with the all_reduce
//      op's kernel the registry chose (kernels::CpuKernels::reduce_sum), into
//      the shared result; barrier;
//   3. every rank copies the shared result into its buffer.
// Because every element is summed as ((b0 + b1) + b2) + ... whichever rank
// computes it, the result is bitwise deterministic and equal to ReduceSum
// over the ranks' buffers. The shared result is double-buffered by call
// parity, so a rank that races ahead into the next call cannot overwrite a
// result another rank is still copying out.
//
// GatherColumnsToRoot: rank 0 publishes its output; barrier; every rank
// writes its column block; barrier.
//
// Thread-safety: RankCollectives(r) is used by rank r's thread only; the
// group must outlive every rank's use of it. All ranks must call the same
// collectives in the same order, or they wait forever (the forward pass
// validates a batch on every rank before the first collective, so ranks fail
// together or not at all).
#pragma once

#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/cpu_ops.h"
#include "worker/parallel/collectives.h"

namespace tessera::parallel {

class InProcessGroup {
 public:
  // The kernel summing rank buffers (the all_reduce op's entry of
  // kernels::CpuKernels).
  using ReduceFn = void (*)(const kernels::cpu::CpuContext&, absl::Span<const float* const>,
                            int64_t, float*);

  // REQUIRES: size >= 1, reduce non-null.
  InProcessGroup(int size, ReduceFn reduce);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const { return size_; }
  // The collectives of rank `rank` (0 <= rank < size()), owned by the group.
  Collectives* rank(int rank);

 private:
  class Rank;

  void AllReduceSum(int rank, const kernels::cpu::CpuContext& ctx, float* data, int64_t n);
  void GatherColumnsToRoot(int rank, const float* local, int64_t rows, int64_t local_cols,
                           int64_t col_offset, int64_t total_cols, float* root_out);

  const int size_;
  const ReduceFn reduce_;
  std::barrier<> barrier_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Shared state; each entry is written before a barrier and read between
  // that barrier and the next (see the header comment).
  std::vector<float*> buffers_;   // per rank
  std::vector<float> result_[2];  // by all-reduce call parity
  float* gather_out_ = nullptr;
};

}  // namespace tessera::parallel
