// Internal to kernels/cpu: the per-ISA kernel bodies behind cpu_ops.h. One
// table per ISA level; each entry covers a sub-range of an op so that
// cpu_ops.cc can validate arguments and spread the work over a ThreadPool.
// The bodies are written once (isa_kernels.inc) and compiled per level in
// isa_scalar.cc, isa_avx2.cc and isa_avx512.cc.
//
// Thread-safety: entries are reentrant; each uses thread-local scratch.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/op_args.h"

namespace tessera::kernels::cpu {

struct IsaKernels {
  // dst[i] = widen(src[i]) for i < n.
  void (*widen)(const void* src, DType dtype, int64_t n, float* dst);
  // Rows [0, rows) of RmsNorm / FusedAddRmsNorm on contiguous rows of `dim`.
  void (*rms_norm)(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* out);
  void (*fused_add_rms_norm)(float* x, float* residual, const float* weight, int64_t rows,
                             int64_t dim, float eps);
  // Rope for tokens [0, num_tokens) (pointers already offset to the first token).
  void (*rope)(const int32_t* positions, int64_t num_tokens, const float* inv_freq, int head_dim,
               float* q, int num_heads, int64_t q_stride, float* k, int num_kv_heads,
               int64_t k_stride);
  // Output columns [n_begin, n_end) of Gemm, for all m rows.
  void (*gemm_columns)(const float* x, int64_t m, const WeightMatrix& w, const float* bias,
                       int64_t n_begin, int64_t n_end, float* y);
  // out[i] = silu(gate[i]) * up[i] for i < n.
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
  // One work item of paged attention: sequence `seq`, kv heads [h_begin,
  // h_end) with all their query heads, and the sequence's new tokens
  // [t_begin, t_end) (relative to its first new token).
  void (*attention)(const PagedAttentionArgs& args, int seq, int h_begin, int h_end,
                    int64_t t_begin, int64_t t_end);
  void (*softmax)(const float* x, int64_t rows, int64_t cols, float* out);
  void (*log_softmax)(const float* x, int64_t rows, int64_t cols, float* out);
  void (*argmax)(const float* x, int64_t rows, int64_t cols, int32_t* out);
  // Elements [begin, end) of ReduceSum.
  void (*reduce_sum)(const float* const* inputs, int num_inputs, int64_t begin, int64_t end,
                     float* out);
};

const IsaKernels& ScalarKernels();
const IsaKernels& Avx2Kernels();
const IsaKernels& Avx512Kernels();

// REQUIRES: `isa` is supported by this CPU.
const IsaKernels& KernelsFor(CpuIsa isa);

}  // namespace tessera::kernels::cpu
