// Reference CPU kernels: the plain, obviously-correct loops that every
// optimized kernel (CPU or GPU) is tested against, and the `cpu_reference`
// backend of the registry. Contracts are identical to kernels/cpu/cpu_ops.h
// (which documents each op); these run single-threaded, accumulate dot
// products and sums in double, and favour clarity over speed.
//
// Thread-safety: every function is reentrant; concurrent calls must not
// write overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/op_args.h"

namespace tessera::kernels::cpu::reference {

absl::Status Embedding(const WeightMatrix& table, absl::Span<const int32_t> ids, float* out);

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

void FusedAddRmsNorm(float* x, float* residual, const float* weight, int64_t rows, int64_t dim,
                     float eps);

void Rope(absl::Span<const int32_t> positions, absl::Span<const float> inv_freq, int head_dim,
          float* q, int num_heads, int64_t q_stride, float* k, int num_kv_heads, int64_t k_stride);

void Gemm(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y);

void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out);

absl::Status WriteKvCache(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                          absl::Span<const int64_t> slot_mapping, const PagedKvCache& cache);

absl::Status PagedAttention(const PagedAttentionArgs& args);

void Softmax(const float* logits, int64_t rows, int64_t cols, float* out);

void LogSoftmax(const float* logits, int64_t rows, int64_t cols, float* out);

void Argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out);

void ReduceSum(absl::Span<const float* const> inputs, int64_t n, float* out);

}  // namespace tessera::kernels::cpu::reference
