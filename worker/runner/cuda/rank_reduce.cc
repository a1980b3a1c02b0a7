#include "worker/runner/cuda/rank_reduce.h"

#include "base/status_macros.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda_backend.h"

namespace tessera::runner {

namespace kcu = ::tessera::kernels::cuda;

RankReduce::RankReduce(int rank, kcu::NcclGroup* nccl, kcu::P2pAllReduce* p2p)
    : rank_(rank), nccl_(nccl), p2p_(nccl != nullptr ? p2p : nullptr) {}

absl::Status RankReduce::AllReduce(void* data, int64_t count, kcu::NcclGroup::DType dtype,
                                   kcu::CudaStream stream) const {
  if (nccl_ == nullptr) return absl::OkStatus();
  if (p2p_ != nullptr && dtype == kcu::NcclGroup::DType::kBf16 &&
      count * 2 <= kernels::kP2pAllReduceMaxBytes && count <= p2p_->max_count()) {
    return p2p_->AllReduceSumBf16(rank_, static_cast<kcu::Bf16*>(data), count, stream);
  }
  return nccl_->AllReduceSum(rank_, data, count, dtype, stream);
}

bool RankReduce::FusesNorm(const kcu::Bf16* delta, const float* residual, int64_t rows,
                           int64_t cols, const float* w, const kcu::Bf16* out) const {
  return p2p_ != nullptr && rows * cols * 2 <= kernels::kP2pAllReduceMaxBytes &&
         rows * cols <= p2p_->max_count() &&
         kcu::P2pAllReduce::AddRmsNormSupports(delta, residual, cols, w, out);
}

absl::Status RankReduce::AddNorm(kcu::Bf16* delta, float* residual, int64_t rows, int64_t cols,
                                 const float* w, float eps, kcu::Bf16* out,
                                 kcu::CudaStream stream) const {
  if (FusesNorm(delta, residual, rows, cols, w, out)) {
    return p2p_->AllReduceAddRmsNorm(rank_, delta, residual, rows, cols, w, eps, out, stream);
  }
  RETURN_IF_ERROR(AllReduce(delta, rows * cols, kcu::NcclGroup::DType::kBf16, stream));
  return kcu::FusedAddRmsNorm(delta, residual, rows, cols, w, eps, out, stream);
}

absl::Status RankReduce::SumNorm(const kcu::Bf16* delta, float* residual, int64_t rows,
                                 int64_t cols, const float* w, float eps, kcu::Bf16* out,
                                 kcu::CudaStream stream) const {
  return p2p_->AllReduceRmsNorm(rank_, delta, residual, rows, cols, w, eps, out, stream);
}

}  // namespace tessera::runner
