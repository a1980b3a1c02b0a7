#include "kernels/cpu/reference_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tessera::kernels::cpu::reference {
namespace {

// Element j of a weight row, widened to f32.
float WeightAt(const WeightMatrix& w, int64_t row, int64_t col) {
  const int64_t i = row * w.cols + col;
  switch (w.dtype) {
    case DType::kF32:
      return static_cast<const float*>(w.data)[i];
    case DType::kF16:
      return F16ToF32(static_cast<const fp16_t*>(w.data)[i]);
    case DType::kBF16:
      return Bf16ToF32(static_cast<const bf16_t*>(w.data)[i]);
  }
  return 0.0f;
}

void RmsNormRow(const float* x, const float* weight, int64_t dim, float eps, float* out) {
  double sum_squares = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum_squares += double{x[i]} * x[i];
  const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_squares / dim + eps));
  for (int64_t i = 0; i < dim; ++i) out[i] = (x[i] * inv_rms) * weight[i];
}

void RotateHeads(float* x, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* head = x + int64_t{h} * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x1 = head[i];
      const float x2 = head[i + half];
      head[i] = x1 * cos[i] - x2 * sin[i];
      head[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

}  // namespace

absl::Status Embedding(const WeightMatrix& table, absl::Span<const int32_t> ids, float* out) {
  if (absl::Status s = ValidateTokenIds(ids, table); !s.ok()) return s;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t j = 0; j < table.cols; ++j) out[t * table.cols + j] = WeightAt(table, ids[t], j);
  }
  return absl::OkStatus();
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
             float* out) {
  for (int64_t r = 0; r < rows; ++r) RmsNormRow(x + r * dim, weight, dim, eps, out + r * dim);
}

void FusedAddRmsNorm(float* x, float* residual, const float* weight, int64_t rows, int64_t dim,
                     float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    float* rr = residual + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      xr[i] += rr[i];
      rr[i] = xr[i];
    }
    RmsNormRow(xr, weight, dim, eps, xr);
  }
}

void Rope(absl::Span<const int32_t> positions, absl::Span<const float> inv_freq, int head_dim,
          float* q, int num_heads, int64_t q_stride, float* k, int num_kv_heads, int64_t k_stride) {
  const int half = head_dim / 2;
  std::vector<float> cos(half), sin(half);
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos[i] = std::cos(angle);
      sin[i] = std::sin(angle);
    }
    if (q != nullptr) RotateHeads(q + t * q_stride, num_heads, head_dim, cos.data(), sin.data());
    if (k != nullptr) {
      RotateHeads(k + t * k_stride, num_kv_heads, head_dim, cos.data(), sin.data());
    }
  }
}

void Gemm(const float* x, int64_t m, const WeightMatrix& w, const float* bias, float* y) {
  const int64_t n = w.rows;
  const int64_t k = w.cols;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias != nullptr ? bias[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) acc += double{x[i * k + p]} * WeightAt(w, j, p);
      y[i * n + j] = static_cast<float>(acc);
    }
  }
}

void SiluMul(const float* gate_up, int64_t rows, int64_t inter, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * inter;
    const float* up = gate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate[i];
      out[r * inter + i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

absl::Status WriteKvCache(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                          absl::Span<const int64_t> slot_mapping, const PagedKvCache& cache) {
  if (absl::Status s = ValidateSlotMapping(slot_mapping, cache); !s.ok()) return s;
  const int64_t row = cache.slot_stride();
  for (size_t t = 0; t < slot_mapping.size(); ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    for (int64_t i = 0; i < row; ++i) {
      cache.k[slot * row + i] = k[t * k_stride + i];
      cache.v[slot * row + i] = v[t * v_stride + i];
    }
  }
  return absl::OkStatus();
}

absl::Status PagedAttention(const PagedAttentionArgs& a) {
  if (absl::Status s = ValidatePagedAttention(a); !s.ok()) return s;
  const PagedKvCache& c = a.cache;
  const int d = c.head_dim;
  const int group = a.num_heads / c.num_kv_heads;
  std::vector<double> scores;
  std::vector<double> acc(d);
  for (int s = 0; s < a.num_seqs(); ++s) {
    const int32_t* block_table = a.block_tables.data() + s * a.block_table_stride;
    const int64_t q_begin = a.query_start_loc[s];
    const int64_t q_len = a.query_start_loc[s + 1] - q_begin;
    const int64_t context_start = a.seq_lens[s] - q_len;
    for (int64_t t = 0; t < q_len; ++t) {
      const int64_t position = context_start + t;
      for (int h = 0; h < a.num_heads; ++h) {
        const float* q = a.q + (q_begin + t) * a.q_token_stride + int64_t{h} * d;
        const int kv_head = h / group;
        auto key_row = [&](const float* base, int64_t key_pos) {
          const int64_t slot =
              int64_t{block_table[key_pos / c.block_size]} * c.block_size + key_pos % c.block_size;
          return base + (slot * c.num_kv_heads + kv_head) * d;
        };
        scores.assign(position + 1, 0.0);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= position; ++j) {
          const float* key = key_row(c.k, j);
          double dot = 0.0;
          for (int i = 0; i < d; ++i) dot += double{q[i]} * key[i];
          scores[j] = dot * a.scale;
          max_score = std::max(max_score, scores[j]);
        }
        double denominator = 0.0;
        for (double& score : scores) {
          score = std::exp(score - max_score);
          denominator += score;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= position; ++j) {
          const float* value = key_row(c.v, j);
          for (int i = 0; i < d; ++i) acc[i] += scores[j] * value[i];
        }
        float* out = a.out + ((q_begin + t) * a.num_heads + h) * d;
        for (int i = 0; i < d; ++i) out[i] = static_cast<float>(acc[i] / denominator);
      }
    }
  }
  return absl::OkStatus();
}

void Softmax(const float* logits, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * cols;
    float* y = out + r * cols;
    float max_value = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < cols; ++i) max_value = std::max(max_value, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < cols; ++i) sum += std::exp(double{x[i]} - max_value);
    for (int64_t i = 0; i < cols; ++i) {
      y[i] = static_cast<float>(std::exp(double{x[i]} - max_value) / sum);
    }
  }
}

void LogSoftmax(const float* logits, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * cols;
    float* y = out + r * cols;
    float max_value = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < cols; ++i) max_value = std::max(max_value, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < cols; ++i) sum += std::exp(double{x[i]} - max_value);
    const double log_normalizer = max_value + std::log(sum);
    for (int64_t i = 0; i < cols; ++i) y[i] = static_cast<float>(x[i] - log_normalizer);
  }
}

void Argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * cols;
    int64_t best = 0;
    for (int64_t i = 1; i < cols; ++i) {
      if (x[i] > x[best]) best = i;
    }
    out[r] = static_cast<int32_t>(best);
  }
}

void ReduceSum(absl::Span<const float* const> inputs, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float sum = inputs[0][i];
    for (size_t r = 1; r < inputs.size(); ++r) sum += inputs[r][i];
    out[i] = sum;
  }
}

}  // namespace tessera::kernels::cpu::reference
