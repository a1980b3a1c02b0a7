// Causal paged prefill attention for Hopper (SM 9.0) on wgmma, the
// warpgroup-wide asynchronous tensor-core MMA that only sm_90a code has.
// Same contract and semantics as PagedAttentionPrefill
// (kernels/cuda/paged_attention.h): the same PagedAttentionParams, fp32
// softmax and accumulation, bf16 out, chunked prefill after cached context,
// GQA, zeros for sequences with inconsistent lengths.
//
// Supported: head_dim 64 and 128 (everything else: use the portable
// PagedAttentionPrefill), any power-of-two block_size. The kernel is built
// only into the sm_90a image of this binary (other images carry a trapping
// stub), so a caller must check PrefillAttentionSm90Available() once, before
// relying on it; the kernel registry offers it as the "cuda-sm90a"
// candidate of attention_prefill (kernels/cuda_backend.h).
//
// Design: grid (head, 128-row query tile, sequence), longest causal rows
// first; two consumer warpgroups of 64 query rows share each K/V tile of
// 128 keys, gathered from the paged cache with 16-byte cp.async into
// 128-byte-swizzled shared memory (three stages). S = Q K^T is a
// shared-memory wgmma (both operands K-major), the online softmax runs on
// the fp32 accumulators, and P goes back to the tensor cores as bf16
// register fragments for O += P V (V N-major, transposed by the
// instruction). A producer warpgroup gathers into an mbarrier ring while
// each consumer overlaps its softmax with its own P V product, and the two
// consumers' tensor-core sections alternate. Only diagonal tiles are masked.
//
// Thread-safety: as PagedAttentionPrefill (reentrant; concurrent calls on
// different streams need different outputs).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/paged_attention.h"

namespace tessera::kernels::cuda {

// Whether PrefillAttentionSm90 can run on the current device: it is SM 9.0
// and this binary's sm_90a image runs there (checked by launching a probe
// kernel and synchronising, so call it at setup time, not while a stream is
// being captured). On false, `why` (when non-null) says why.
bool PrefillAttentionSm90Available(std::string* why = nullptr);

// Whether PrefillAttentionSm90 handles these parameters' shape (head_dim 64
// or 128, no token-tree masks, scale > 0). The rest of the parameters are
// validated by the call itself.
bool PrefillAttentionSm90Supports(const PagedAttentionParams& p);

// PagedAttentionPrefill on wgmma. INVALID_ARGUMENT for bad or unsupported
// parameters, FAILED_PRECONDITION when the current device is not SM 9.0 or
// this binary has no sm_90a code for the kernel. Does not synchronise; can
// be captured in a CUDA graph.
absl::Status PrefillAttentionSm90(const PagedAttentionParams& p, CUstream_st* stream);

}  // namespace tessera::kernels::cuda
