// bf16 GEMM on the GPU through cuBLASLt: y[m, n] = x[m, k] . W[n, k]^T
// (+ bias[n]), fp32 accumulation, bf16 or fp32 output (the fp32 overload is
// for logits). x and W are bf16 row-major (W in HF [out, in] layout), bias
// fp32 [n] or null, all device pointers.
//
// A GemmContext owns a cuBLASLt handle, a 32 MiB workspace and a 32 MiB
// fp32 scratch, and caches the matmul descriptors and the heuristic's
// algorithm per (shape, output type, bias, pointer alignment). A call never
// synchronizes and never allocates device memory, so it can be captured in
// a CUDA graph (the first call of a shape does host-side descriptor work;
// warm shapes before capture to keep capture cheap). Bias is fp32 and added
// in fp32 before the one rounding: a biased bf16 GEMM runs as an fp32 GEMM
// with the bias epilogue into the scratch, in row chunks of up to
// 8M / n rows, each rounded to bf16 by a small kernel (n <= 8M).
//
// Calls with m <= 8, k % 8 == 0 and 16-byte aligned x and W run the
// tensor-core GEMV of gemv.h instead (bias fused, one rounding, split-K
// partials in the context's own 4 MiB workspace); SetUseGemv(false) sends
// them to cuBLASLt too (benchmarks compare the two).
//
// Thread-safety: a GemmContext may be used by one thread at a time on its
// device (calls are serialized by an internal mutex, but the workspace is
// shared, so calls on different streams must not overlap in time: use one
// context per stream).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/gemv.h"

namespace tessera::kernels::cuda {

// Gemm() routes m <= 8 to the GEMV for weights of at most this many
// elements (64 MiB of bf16), cuBLASLt above.
inline constexpr int64_t kGemvDefaultMaxWeightElems = int64_t{1} << 25;

inline constexpr int kGemmAutotuneCandidates = 32;
inline constexpr int kGemmMaxAutotuneCandidates = 64;

// Autotuning picks shared by the GemmContexts of a tensor-parallel group
// (GemmContext::ShareTuning). The first context to tune a shape times the
// candidates and records the fastest; the others wait for that pick and
// take it (where cuBLASLt accepts it for their operands) instead of timing
// their own. Every rank then runs the same kernel for a shape: ranks that
// meet at an all-reduce after each projection do not wait for a peer whose
// timing happened to pick a slower one. Thread-safe.
class GemmTuningTable {
 public:
  GemmTuningTable();
  ~GemmTuningTable();
  GemmTuningTable(const GemmTuningTable&) = delete;
  GemmTuningTable& operator=(const GemmTuningTable&) = delete;

  // Tests: what the next shape tuned through this table tells the contexts
  // waiting for its pick. kNothingTimed: that the tuner could time no
  // candidate (they time their own); kUnusablePick: an algorithm cuBLASLt
  // refuses for their operands (one set up for fp64), which they must
  // detect and time their own. The tuner itself keeps its real pick.
  enum class TestOutcome { kPick, kNothingTimed, kUnusablePick };
  void SetNextOutcomeForTest(TestOutcome outcome);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Reads `bytes` (a multiple of 16) of device memory at `buf` through L2,
// not L1, with `blocks` CTAs, so that L2 ends up holding clean lines of it
// only: the flush GemmContext's tuning runs before each timed GEMM. `sink` (device, 4 bytes) is
// written only for a sum of the words that a buffer of zeros never has.
absl::Status ReadThroughL2(const void* buf, size_t bytes, int blocks, int* sink, CudaStream stream);

class GemmContext {
 public:
  // Creates the handle and workspace on the current device.
  static absl::StatusOr<std::unique_ptr<GemmContext>> Create();
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  // m == 0 is a no-op. INVALID_ARGUMENT for negative/zero n or k, null
  // pointers or a shape above int32 range; INTERNAL (with cuBLAS's status
  // name) when cuBLASLt fails or offers no algorithm.
  absl::Status Gemm(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                    const float* bias, Bf16* y, CudaStream stream);
  absl::Status Gemm(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                    const float* bias, float* y, CudaStream stream);

  // While set (max_m > 0), the next cuBLASLt call of each shape with
  // m <= max_m that has not been tuned yet is: of the algorithms cuBLASLt's
  // heuristic offers (up to SetAutotuneCandidates' number), each is timed
  // on the call's own operands, every run after an L2 flush (a step streams
  // its weights from HBM), and the fastest is kept for
  // the shape from then on (a one-time cost of a few hundred GEMMs and
  // flushes, milliseconds per shape; during stream capture nothing can be
  // timed, and the shape keeps the heuristic's first choice for good).
  // Rounding may then differ between processes, never between calls of one
  // context. Default 0: the
  // heuristic's first choice. The CUDA runner opens this window for one
  // eager decode step per batch bucket, before it captures that bucket's
  // first graph.
  void SetAutotune(int64_t max_m);
  // How many of the heuristic's algorithms autotuning times per shape
  // (clamped to 1 .. kGemmMaxAutotuneCandidates); applies to shapes first
  // seen after the call. Default kGemmAutotuneCandidates.
  void SetAutotuneCandidates(int candidates);
  // Tunes through `table` from now on (null: alone).
  void ShareTuning(std::shared_ptr<GemmTuningTable> table);
  // Shapes this context timed candidates for itself (not those it took
  // from a shared table).
  int shapes_timed() const;
  // Shared picks this context could not use because cuBLASLt refused them
  // for its operands (it timed its own candidates instead).
  int picks_refused() const;

  // Default true: m <= 8 GEMMs use the GEMV kernel when it applies.
  void SetUseGemv(bool use);
  // The largest weight (n * k elements) Gemm() sends to the GEMV; default
  // kGemvDefaultMaxWeightElems. Benchmarks move it to compare the paths.
  void SetGemvMaxWeightElems(int64_t elems);
  // Whether Gemm() would send m rows with k inputs to the GEMV (SetUseGemv,
  // m <= 8, k % 8 == 0; the weight size is not checked).
  bool GemvTakes(int64_t m, int64_t k) const;
  // gemv.h GemvQkvRopeBf16 on the context's workspace (the staged kernel
  // where StagedTakes); FAILED_PRECONDITION when !GemvTakes(m, k).
  absl::Status QkvRope(const Bf16* x, int64_t m, int64_t k, const Bf16* w_qkv, const float* bias,
                       Bf16* qkv, const GemvQkvRope& rope, CudaStream stream);

  // Gemm() for a projection whose x the kernel just before it on `stream`
  // writes (decode steps: qkv and gate/up after the RMSNorm or the
  // all-reduce + RMSNorm, o_proj after attention): where StagedTakes,
  // gemv.h GemvStagedBf16, whose weight copies overlap that kernel;
  // otherwise Gemm(). Any predecessor is correct; the overlap needs one
  // that calls AllowDependentLaunch.
  absl::Status GemmChained(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                           const float* bias, Bf16* y, CudaStream stream);
  // Whether QkvRope / GemmChained run the staged kernel for the shape: the
  // GEMV and the staged kernel are on, m == 1 (decode steps of one token),
  // n % 8 == 0, k % 128 == 0, k <= kStagedMaxK (pointer alignment is not
  // checked), and either its n / 8 CTAs fit on the device at once or the
  // weight is one Gemm() sends to cuBLASLt (n * k above the GEMV's limit).
  // From H200 measurements (cuda_ops_bench, rmsnorm_then_gemm rows): every
  // CTA copies all of x, which at m = 8 is as many bytes as W; a grid of
  // one wave requests all of W before the kernel it follows ends; a grid of
  // two waves lost to the tiled GEMV, whose 16-row tiles fit in one
  // (Llama-3-8B qkv 20.0 against 18.4 us with the norm, o_proj 16.7 against
  // 15.6); the many-wave gate/up projections matched cuBLASLt after a norm
  // (61.0 against 61.7 us, one TP=2 rank's 35.3 against 35.7).
  bool StagedTakes(int64_t m, int64_t n, int64_t k) const;
  // Default: on where the device supports it (SM 9.0+); benchmarks and
  // tests compare it with the other GEMV.
  void SetUseStagedGemv(bool use);
  struct Impl;

 private:
  explicit GemmContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::kernels::cuda
