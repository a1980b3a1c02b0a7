// Token sampling on the GPU without a host round trip: the same algorithm
// and the same Philox draw as the CPU sampler (worker/sampling/sampler.h),
// so that for identical logits both pick the same token.
//
// The sampled rows' statistics (largest finite logit, NaN / +inf, finite
// count) and weights exp(s - max) are computed once, spread over the GPU
// (grids of chunks per row, into the workspace); then a group of CTAs per
// row runs the selection, each over its part of the row, combining what it
// needs over the group in a fixed order.
// Per row: temperature < kGreedyTemperature (1e-5) is the
// argmax (lowest id among ties); otherwise, exactly as sampler.cc:
//   s = double(logit) / temperature over the finite logits; top-k keeps
//   s >= the k-th largest (ties kept); weights w = expf(float(s - max));
//   top-p keeps, in (s desc, id asc) order, each token whose preceding mass
//   is < top_p * sum(w); min-p keeps w >= min_p; the token is drawn by
//   inverse CDF in ascending id with u = UniformFromSeed(seed, position,
//   kSample). Thresholds are found by radix search over order-preserving
//   float keys (top-k by counts, top-p by weight masses; deterministic, no
//   sort). Sums are in double in a fixed order that differs from the CPU's
//   sequential order, so a token can differ only when u, or top_p times the
//   total, falls within ~1e-15 of a boundary.
// Penalties (repetition/frequency/presence) are NOT applied here: they need
// the per-sequence token counts, so the caller applies them to the logits
// first (on the host or with its own kernel), as the CPU sampler does in
// step 1. Logprobs are left to Softmax/LogSoftmax (logits.h).
//
// Invalid input is reported per row as token -1 (no host sync is possible):
// a NaN or +inf logit, no finite logit, or parameters outside the ranges of
// ValidateSamplingParams (the caller validates params on the host); also a
// row whose selection CTAs did not all run within 4 s of each other (a
// device shared with work that holds its SMs that long).
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// One row's parameters, laid out for a single host-to-device copy of an
// array of them. Same meaning as tessera::sampling::SamplingParams.
struct RowSamplingParams {
  float temperature = 1.0f;  // < 1e-5: greedy
  int32_t top_k = 0;         // <= 0 or >= vocab: disabled
  float top_p = 1.0f;        // (0, 1]; 1 disabled
  float min_p = 0.0f;        // [0, 1]; 0 disabled
  uint64_t seed = 0;
  int64_t position = 0;  // index of the token being drawn in its sequence
};
static_assert(sizeof(RowSamplingParams) == 32);

// Device scratch SampleRows needs: every sampled row's weights (vocab
// floats), 32 bytes of state per row (statistics, arrival counter, picks)
// and the selection groups' partials (2 KB per CTA and combine parity, 1 MB
// at most).
size_t SampleRowsWorkspaceBytes(int64_t rows, int64_t vocab);

// logits: fp32 [rows, vocab]; params: [rows]; out: int32 [rows]; workspace:
// SampleRowsWorkspaceBytes(rows, vocab) bytes, 16-byte aligned. All device
// pointers. INVALID_ARGUMENT for bad sizes (rows at most 65535, vocab in
// [1, 2^24]), null pointers or a small workspace.
absl::Status SampleRows(const float* logits, int64_t rows, int64_t vocab,
                        const RowSamplingParams* params, int32_t* out, void* workspace,
                        size_t workspace_bytes, CudaStream stream);

}  // namespace tessera::kernels::cuda
