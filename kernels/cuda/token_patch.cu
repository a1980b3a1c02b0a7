// Placeholder tokens from the previous step's draws (see token_patch.h).
//
// One thread per pair; pairs name distinct token slots in practice, and
// when two name the same slot the kernel writes one of them (the host
// checks nothing more: either is a drawn id).
//
// Thread-safety: see the header.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/token_patch.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    PatchTokensKernel(int32_t* __restrict__ tokens, const int32_t* __restrict__ drawn,
                      const int32_t* __restrict__ pairs, int64_t n, int64_t vocab) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t id = drawn[pairs[2 * i + 1]];
  tokens[pairs[2 * i]] = (id >= 0 && id < vocab) ? id : 0;
}

}  // namespace

absl::Status PatchTokensFromPrevious(int32_t* tokens, const int32_t* drawn, const int32_t* pairs,
                                     int64_t n, int64_t vocab, CudaStream stream) {
  if (n < 0 || vocab < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PatchTokensFromPrevious: bad sizes n=", n, " vocab=", vocab));
  }
  if (n == 0) return absl::OkStatus();
  if (tokens == nullptr || drawn == nullptr || pairs == nullptr) {
    return absl::InvalidArgumentError("PatchTokensFromPrevious: null pointer");
  }
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("PatchTokensFromPrevious: ", n, " pairs"));
  }
  PatchTokensKernel<<<static_cast<unsigned>(blocks), kThreads, 0, AsCuda(stream)>>>(
      tokens, drawn, pairs, n, vocab);
  return CheckLastLaunch("PatchTokensFromPrevious");
}

}  // namespace tessera::kernels::cuda
