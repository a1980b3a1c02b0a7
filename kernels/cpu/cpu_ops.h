// Optimized CPU kernels: the `cpu` backend of the kernel registry. Each op
// splits its work over a ThreadPool and runs SIMD code for the ISA level in
// its CpuContext (AVX-512, AVX2+FMA+F16C, or portable scalar), chosen at run
// time; the binary itself stays baseline x86-64.
//
// All activations are fp32; weights may be bf16, fp16 or fp32 and are
// widened to fp32 on the fly; every sum accumulates in fp32. The plain
// reference for each op lives in kernels/cpu/reference_ops.h; parity
// tolerances are stated in kernels/cpu/cpu_ops_test.cc and kernels/README.md.
// Layouts are documented in kernels/cpu/op_args.h.
//
// A forward pass of a Llama/Qwen decoder layer calls, per step:
//   Embedding                         (first layer)   hidden = E[ids]
//   RmsNorm / FusedAddRmsNorm                         input_layernorm
//   Gemm (qkv, + bias for Qwen2)      Rope (q, k)     WriteKvCache (k, v)
//   PagedAttention                    Gemm (o_proj)
//   FusedAddRmsNorm                                   post_attention_layernorm
//   Gemm (gate_up)  SiluMul  Gemm (down)
//   ... final FusedAddRmsNorm, Gemm (lm_head), then Argmax / Softmax / LogSoftmax.
//
// Thread-safety: every op is reentrant; ops sharing one ThreadPool are
// serialized by it. Outputs of concurrent calls must not overlap.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::kernels::cpu {

// Where and how the optimized kernels run.
struct CpuContext {
  ThreadPool* pool = nullptr;    // null: run on the calling thread only
  CpuIsa isa = CpuIsa::kScalar;  // REQUIRES: supported by the CPU (cpu_features.h)
};

// DefaultThreadPool() and the best ISA level of this CPU.
CpuContext DefaultCpuContext();

// out[t, :] = widen(table[ids[t], :]) for t < ids.size(). out: [ids.size(), table.cols].
// INVALID_ARGUMENT (and nothing written) when an id is outside [0, table.rows).
absl::Status Embedding(const CpuContext& ctx, const WeightMatrix& table,
                       absl::Span<const int32_t> ids, float* out);

// For each row r of x [rows, dim]:
//   out[r, i] = (x[r, i] * 1 / sqrt(mean_j(x[r, j]^2) + eps)) * weight[i]
// (HF LlamaRMSNorm / Qwen2RMSNorm in fp32). out may equal x. For Qwen3's
// q/k-norm pass rows = tokens * heads and dim = head_dim.
void RmsNorm(const CpuContext& ctx, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps, float* out);

// The residual form used between sublayers (vLLM's fused_add_rms_norm). For each row:
//   x[r] += residual[r];  residual[r] = x[r];  x[r] = RmsNorm(x[r]) * weight
// i.e. afterwards `residual` holds the un-normalized sum (the new residual
// stream) and `x` the normalized input of the next sublayer.
// REQUIRES: x and residual do not overlap.
void FusedAddRmsNorm(const CpuContext& ctx, float* x, float* residual, const float* weight,
                     int64_t rows, int64_t dim, float eps);

// Rotary embedding, neox / HF rotate_half style, in place on q and k:
//   for token t, every head, i < head_dim / 2, with angle = float(positions[t]) * inv_freq[i]:
//     (x[i], x[i + half]) <- (x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin)
// q: [num_tokens, num_heads, head_dim] with token stride q_stride (elements),
// k: [num_tokens, num_kv_heads, head_dim] with token stride k_stride; so q and
// k may live inside a fused qkv projection output. k may be null. inv_freq
// has head_dim / 2 entries and already includes any scaling (llama3, linear,
// ...); attention-factor scaling (yarn) is not applied here.
// REQUIRES: head_dim even, 2 <= head_dim <= 512; inv_freq.size() == head_dim / 2.
void Rope(const CpuContext& ctx, absl::Span<const int32_t> positions,
          absl::Span<const float> inv_freq, int head_dim, float* q, int num_heads, int64_t q_stride,
          float* k, int num_kv_heads, int64_t k_stride);

// y[m, n] = x[m, k] . W[n, k]^T (+ bias[n]) with n = w.rows, k = w.cols
// (HF nn.Linear). x and y are contiguous row-major fp32; bias is fp32 or
// null. m = 1 runs a bandwidth-bound GEMV; larger m widens weight panels to
// fp32 once and reuses them across rows.
// REQUIRES: y does not overlap x.
void Gemm(const CpuContext& ctx, const float* x, int64_t m, const WeightMatrix& w,
          const float* bias, float* y);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i], silu(g) = g / (1 + exp(-g)).
// gate_up: [rows, 2 * inter], the output of one GEMM over the concatenated
// [gate_proj; up_proj] weights (gate first). out: [rows, inter].
void SiluMul(const CpuContext& ctx, const float* gate_up, int64_t rows, int64_t inter, float* out);

// Writes the new tokens' K and V into the paged cache:
//   for t with slot = slot_mapping[t] >= 0:
//     cache.k[slot, :, :] = k[t * k_stride .. + num_kv_heads * head_dim]   (V likewise)
// Negative slots are skipped (padding). INVALID_ARGUMENT (and nothing
// written) when a slot is outside the cache.
absl::Status WriteKvCache(const CpuContext& ctx, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, absl::Span<const int64_t> slot_mapping,
                          const PagedKvCache& cache);

// Paged causal attention with grouped-query heads and online softmax; see
// PagedAttentionArgs for the exact semantics. Handles prefill chunks,
// decode (q_len = 1) and mixed batches. INVALID_ARGUMENT (and nothing
// written) when ValidatePagedAttention fails. Rows of sequences with
// seq_len 0 do not exist (q_len <= seq_len).
absl::Status PagedAttention(const CpuContext& ctx, const PagedAttentionArgs& args);

// Row-wise softmax over logits [rows, cols] into out (may equal logits).
// REQUIRES: every row has a finite maximum; entries may be -inf (-> 0); no NaN.
void Softmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols, float* out);

// Row-wise log-softmax: out = x - max - log(sum(exp(x - max))). Same REQUIRES.
void LogSoftmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols, float* out);

// out[r] = index of the largest entry of row r; ties go to the lowest index
// (as torch.argmax). REQUIRES: cols >= 1, no NaN.
void Argmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols, int32_t* out);

// out[i] = ((inputs[0][i] + inputs[1][i]) + inputs[2][i]) + ..., for i < n:
// the arithmetic of the CPU all-reduce (bitwise identical to the reference).
// out may equal one of the inputs. REQUIRES: inputs non-empty.
void ReduceSum(const CpuContext& ctx, absl::Span<const float* const> inputs, int64_t n, float* out);

}  // namespace tessera::kernels::cpu
