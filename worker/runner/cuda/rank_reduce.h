// RankReduce: how one tensor-parallel rank sums its partial results with
// the other ranks of its group: NCCL, or for bf16 messages up to
// kernels::kP2pAllReduceMaxBytes the peer-to-peer all-reduce, which also
// fuses the residual add and the next RMSNorm into its kernel. On one rank
// (no group) every reduction is the identity.
//
// Thread-safety: const after construction; one rank's thread calls it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/nccl_group.h"

namespace tessera::kernels::cuda {
class P2pAllReduce;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

class RankReduce {
 public:
  RankReduce() = default;  // one rank
  // `nccl` null: one rank; `p2p` null: NCCL only.
  RankReduce(int rank, kernels::cuda::NcclGroup* nccl, kernels::cuda::P2pAllReduce* p2p);

  bool sharded() const { return nccl_ != nullptr; }

  // Sum over the ranks, in place.
  absl::Status AllReduce(void* data, int64_t count, kernels::cuda::NcclGroup::DType dtype,
                         kernels::cuda::CudaStream stream) const;
  // Whether AddNorm and SumNorm of [rows, cols] run as one p2p kernel.
  bool FusesNorm(const kernels::cuda::Bf16* delta, const float* residual, int64_t rows,
                 int64_t cols, const float* w, const kernels::cuda::Bf16* out) const;
  // residual += Σ delta; out = RMSNorm(residual) · w.
  absl::Status AddNorm(kernels::cuda::Bf16* delta, float* residual, int64_t rows, int64_t cols,
                       const float* w, float eps, kernels::cuda::Bf16* out,
                       kernels::cuda::CudaStream stream) const;
  // residual = Σ delta; out = RMSNorm(residual) · w (REQUIRES: FusesNorm).
  absl::Status SumNorm(const kernels::cuda::Bf16* delta, float* residual, int64_t rows,
                       int64_t cols, const float* w, float eps, kernels::cuda::Bf16* out,
                       kernels::cuda::CudaStream stream) const;

 private:
  int rank_ = 0;
  kernels::cuda::NcclGroup* nccl_ = nullptr;
  kernels::cuda::P2pAllReduce* p2p_ = nullptr;
};

}  // namespace tessera::runner
