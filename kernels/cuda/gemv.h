// Skinny bf16 GEMM for decode (m <= 8 rows of activations): y[m, n] =
// x[m, k] . W[n, k]^T (+ bias[n]), fp32 accumulation, bf16 or fp32 output.
// The same layouts as GemmContext::Gemm (x and W bf16 row-major, W in HF
// [out, in] layout, bias fp32 [n] or null, all device pointers).
//
// The kernel streams W once from HBM with 16-byte non-allocating loads and
// multiplies on the bf16 tensor cores (the m <= 8 activation rows are the
// n = 8 side of an m16n8k16 tile), so its cost is the weight bytes. The k
// dimension is split across the four warps of a CTA and, when the 16-row
// tiles of W alone would not fill the GPU, across CTAs ("splits"); split
// partials go to a GemvWorkspace and the last CTA of each tile sums them in
// split order (a per-tile arrival counter that the last CTA resets), so the
// result is bitwise deterministic, no second launch is needed, and a call
// never synchronizes or allocates: it can be captured in a CUDA graph.
//
// Requirements (GemvApplicable): 1 <= m <= 8, k % 8 == 0, x and W 16-byte
// aligned. Other shapes go to cuBLASLt (GemmContext does that).
//
// The staged form (GemvStagedBf16, below; SM 9.0+) copies each CTA's 8
// rows of W into shared memory while the kernel before it still runs
// (programmatic dependent launch), for projections whose x that kernel
// writes; GemvStagedGateUpSiluBf16 adds SiLU·mul to its gate/up epilogue.
//
// Thread-safety: a GemvWorkspace may be used by one stream at a time
// (concurrent calls sharing one would mix their partials).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

inline constexpr int64_t kGemvMaxRows = 8;

// Device scratch of the split-K path. `counters` must be zero before the
// first call (kernels leave them zero).
struct GemvWorkspace {
  float* partials = nullptr;  // partial_capacity floats
  int64_t partial_capacity = 0;
  uint32_t* counters = nullptr;  // counter_capacity entries
  int64_t counter_capacity = 0;
  int num_sms = 0;      // the device's SM count (sizes the splits)
  int ctas_per_sm = 0;  // resident GEMV CTAs per SM (GemvResidentCtasPerSm); 0: 4
  // GemvQkvRopeBf16 runs the staged kernel where it applies (set only when
  // GemvStagedSupported()).
  bool staged = false;
};

// CTAs of the GEMV kernel one SM holds at once (the occupancy calculator's
// answer for the current device), or an error from the runtime.
absl::Status GemvResidentCtasPerSm(int* ctas);

// Bytes of partials and counters GemmContext reserves for the GEMV.
inline constexpr int64_t kGemvPartialFloats = 1 << 20;  // 4 MiB
inline constexpr int64_t kGemvCounters = 1 << 14;

// True when GemvBf16 accepts the problem.
bool GemvApplicable(const Bf16* x, int64_t m, int64_t k, const Bf16* w);

// Number of k splits the kernel uses for the shape (1: no workspace use).
// Rule: with T = ceil(n / 16) row tiles, T >= num_sms runs unsplit;
// otherwise, with S = num_sms * ctas_per_sm resident slots, floor(S / T)
// splits (one wave of CTAs, each a whole number of 512-value iterations of
// k).
// `force_splits` > 0 asks for that many (capped by the k steps and the
// workspace); tests use it to exercise the split path on small shapes.
int GemvSplits(int64_t m, int64_t n, int64_t k, const GemvWorkspace& ws, int force_splits = 0);

// INVALID_ARGUMENT when !GemvApplicable, n <= 0, null y, or a shape above
// int32 range; INTERNAL on a launch error.
absl::Status GemvBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                      const float* bias, Bf16* y, const GemvWorkspace& ws, CudaStream stream,
                      int force_splits = 0);
absl::Status GemvBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                      const float* bias, float* y, const GemvWorkspace& ws, CudaStream stream,
                      int force_splits = 0);

// The fused q/k/v projection of a decode step with RoPE and the KV-cache
// write in the GEMV's epilogue (what the Rope kernel with a RopeKvWrite does
// after a plain GEMV, kernels/cuda/rope.h), for models without q/k norms.
// w_qkv and bias hold the q heads, the k heads, then the v heads, with the
// rows of every q and k head in RoPE order: the head's feature f at row
// GemvRopeRow(f, head_dim), so that every 8 rows hold 4 features and
// their rotation partners (f + head_dim / 2). qkv is written in the normal
// order ([m, q_rows + 2 k_rows], q and k rotated), and when slots is set,
// row r's k (rotated) and v go to the caches at slot slots[r] (a slot < 0
// or >= num_slots is skipped). Rounding as the unfused pair: the projection
// rounded to bf16, then rotated in fp32 and rounded again.
struct GemvQkvRope {
  int head_dim = 0;                    // a multiple of 16
  int64_t q_rows = 0;                  // num_heads * head_dim
  int64_t k_rows = 0;                  // num_kv_heads * head_dim (also the v rows)
  const int32_t* positions = nullptr;  // device [m]
  const float* inv_freq = nullptr;     // device [head_dim / 2]
  const int64_t* slots = nullptr;      // device [m], or null: no cache write
  int64_t num_slots = 0;
  Bf16* k_cache = nullptr;  // [num_slots, k_rows]
  Bf16* v_cache = nullptr;
};

// Where a q or k head's feature f sits in the RoPE row order (0 <= f <
// head_dim): features 4j .. 4j + 3 at rows 8j .. 8j + 3, their partners
// (f + head_dim / 2) four rows after them.
int64_t GemvRopeRow(int64_t f, int64_t head_dim);

// INVALID_ARGUMENT also when head_dim is not a multiple of 16, the heads do
// not fill q_rows / k_rows, or positions / inv_freq / a cache is missing.
// With ws.staged, m == 1 (GemmContext::StagedTakes says why), no forced
// splits and a shape GemvStagedApplicable takes, the staged kernel below
// runs instead (same rounding, RoPE and cache writes).
absl::Status GemvQkvRopeBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w_qkv,
                             const float* bias, Bf16* qkv, const GemvQkvRope& rope,
                             const GemvWorkspace& ws, CudaStream stream, int force_splits = 0);

// The staged GEMV, for a projection whose x the kernel just before it on
// the stream writes (an RMSNorm, or the all-reduce with the residual add
// and RMSNorm, kernels that end latency-bound with HBM idle). It is
// launched as a programmatic dependent (SM 9.0+): its CTAs start while
// that kernel still runs, each copies its 8 rows of W (all of k) into
// shared memory with bulk copies, and only then waits for the kernel's
// results (griddepcontrol.wait) and reads x. The weight stream so overlaps
// the kernel before it; kernels that call AllowDependentLaunch
// (dependent_launch.cuh: RmsNorm, FusedAddRmsNorm, the p2p all-reduce +
// norm, decode attention) let it start early, any other predecessor when
// it ends. The sums are
// the GEMV's (fp32, bias in fp32, one rounding), in another order. Needs
// GemvStagedApplicable: m <= 8, n % 8 == 0, k % 128 == 0, k <= kStagedMaxK
// (at m = 1 the 8 W rows and x fit in shared memory three times per SM),
// aligned x and W. No workspace; captures into CUDA graphs. INVALID_ARGUMENT for
// shapes it does not take, FAILED_PRECONDITION without GemvStagedSupported().
inline constexpr int64_t kStagedMaxK = 4096;
// The current device runs an image of the staged kernel compiled for SM
// 9.0 or newer.
bool GemvStagedSupported();
bool GemvStagedApplicable(const Bf16* x, int64_t m, int64_t n, int64_t k, const Bf16* w);
// CTAs of the staged kernel for m rows and k inputs one SM holds at once
// (the occupancy calculator, with its shared memory: 3 on the H200 at m = 1,
// k = 4096); a grid of n / 8 CTAs.
absl::Status GemvStagedResidentCtasPerSm(int64_t m, int64_t k, int* ctas);
absl::Status GemvStagedBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                            const float* bias, Bf16* y, CudaStream stream);

// Where row r of a fused [gate; up] weight (inter rows each) sits in the
// gate/up GEMV order: gate rows j .. j + 3 at 8 (j / 4) .. + 3, their up
// rows four after them, so an 8-row tile holds both halves of 4 outputs.
int64_t GemvGateUpRow(int64_t r, int64_t inter);

// The staged GEMV on a gate/up weight (and bias) in GemvGateUpRow order,
// with SiLU-and-multiply in its epilogue: act[m, inter] = silu(gate) * up,
// each projection rounded to bf16 first, as the GEMV followed by SiluMul
// (silu_mul.h) computes it; no gate_up buffer, one kernel less. Needs
// inter % 4 == 0 and what GemvStagedBf16 needs (n = 2 inter).
absl::Status GemvStagedGateUpSiluBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w_gate_up,
                                      int64_t inter, const float* bias, Bf16* act,
                                      CudaStream stream);

}  // namespace tessera::kernels::cuda
