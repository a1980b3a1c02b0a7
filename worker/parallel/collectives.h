// Collectives: what a tensor-parallel rank's forward pass needs from its
// group, as seen by one rank. Every rank of the group must make the same
// sequence of calls with the same sizes (the ranks run the same forward in
// lockstep); a call returns when the group's result is in place.
//
// The CPU implementation is InProcessGroup (in_process_group.h); a NCCL one
// for CUDA ranks will implement the same calls.
//
// Thread-safety: one Collectives object belongs to one rank's thread.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace tessera::parallel {

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place on every rank: data[i] = sum over ranks r = 0, 1, ... of rank
  // r's data[i], added in rank order (bitwise the same on every rank and the
  // same as kernels' ReduceSum over the ranks' buffers). `ctx` runs this
  // rank's share of the arithmetic. REQUIRES: the same n on every rank.
  virtual void AllReduceSum(const kernels::cpu::CpuContext& ctx, float* data, int64_t n) = 0;

  // Gathers column blocks to rank 0: every rank holds `local` [rows,
  // local_cols] (row-major) that belongs at columns [col_offset, col_offset +
  // local_cols) of a [rows, total_cols] matrix; rank 0 passes that matrix as
  // `root_out` (others pass null) and has it complete on return.
  // REQUIRES: the ranks' column blocks tile [0, total_cols); the same rows
  // and total_cols on every rank.
  virtual void GatherColumnsToRoot(const float* local, int64_t rows, int64_t local_cols,
                                   int64_t col_offset, int64_t total_cols, float* root_out) = 0;
};

}  // namespace tessera::parallel
