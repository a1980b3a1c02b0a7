#include "worker/runner/cpu_mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/fp8_e4m3.h"

namespace tessera::runner {
namespace {

constexpr int64_t kMaxRopeDim = 1024;  // far above any released model (64)

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The cache slots token t of `batch` attends to, in position order: the
// context before its chunk, then its causal prefix in the chunk (or, for a
// token tree, its ancestors root first) and itself.
void ContextSlots(const ForwardBatch& batch, int s, int t, int block_size,
                  std::vector<int64_t>* slots) {
  const int begin = batch.query_start_loc[s];
  const int q_len = batch.query_start_loc[s + 1] - begin;
  const int start = batch.seq_lens[s] - q_len;
  const int32_t* table = batch.block_tables.data() + int64_t{s} * batch.block_table_stride;
  auto slot_of = [&](int index) {
    return int64_t{table[index / block_size]} * block_size + index % block_size;
  };
  slots->clear();
  for (int c = 0; c < start; ++c) slots->push_back(slot_of(c));
  const int j = t - begin;
  if (batch.tree_parents.empty()) {
    for (int i = 0; i <= j; ++i) slots->push_back(slot_of(start + i));
    return;
  }
  const size_t context = slots->size();
  for (int i = j; i >= 0; i = batch.tree_parents[begin + i]) slots->push_back(slot_of(start + i));
  std::reverse(slots->begin() + context, slots->end());
}

// An FP8 weight [rows, cols] widened to fp32: e4m3 value x its scale (one
// per tensor, per row, or per block_out x block_in block; quantization.h).
absl::StatusOr<std::vector<float>> DequantizeFp8(const model::TensorView& w,
                                                 const model::Fp8Scales& s,
                                                 const model::QuantizationConfig& q) {
  absl::StatusOr<std::vector<float>> grid = model::ToFloat32(s.weight_scale);
  if (!grid.ok()) return grid.status();
  const int64_t rows = w.shape[0], cols = w.shape[1];
  const int64_t block_cols = (cols + q.block_in - 1) / q.block_in;
  const auto& table = kernels::cpu::E4m3Table();
  const auto* bits = reinterpret_cast<const uint8_t*>(w.data);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < cols; ++i) {
      float scale = (*grid)[0];
      if (q.weight_strategy == model::WeightScaleStrategy::kChannel) scale = (*grid)[o];
      if (q.weight_strategy == model::WeightScaleStrategy::kBlock) {
        scale = (*grid)[(o / q.block_out) * block_cols + i / q.block_in];
      }
      out[o * cols + i] = table[bits[o * cols + i]] * scale;
    }
  }
  return out;
}

absl::StatusOr<CpuLinear> Linear(const model::TensorView& w, const model::LayerWeights& lw,
                                 const model::ModelConfig& c, CpuWeightLoader* loader) {
  return CpuLinear::Prepare({&w}, lw, c.quantization, loader);
}

}  // namespace

absl::StatusOr<CpuMlaAttention> CpuMlaAttention::Prepare(const model::ModelConfig& c,
                                                         const model::LayerWeights& lw,
                                                         std::vector<float> inv_freq,
                                                         CpuWeightLoader* loader) {
  if (!c.mla || !lw.mla) {
    return absl::InvalidArgumentError("CpuMlaAttention needs an MLA config and MLA weights");
  }
  const model::MlaConfig& m = *c.mla;
  if (static_cast<int64_t>(inv_freq.size()) * 2 != m.qk_rope_head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE table has ", inv_freq.size(), " frequencies; qk_rope_head_dim = ", m.qk_rope_head_dim,
        " needs half as many"));
  }
  if (m.qk_rope_head_dim > kMaxRopeDim) {
    return absl::UnimplementedError(absl::StrCat("qk_rope_head_dim = ", m.qk_rope_head_dim,
                                                 " exceeds the CPU MLA limit of ", kMaxRopeDim));
  }
  CpuMlaAttention a;
  a.mla_ = m;
  a.heads_ = c.num_attention_heads;
  a.inv_freq_ = std::move(inv_freq);
  const model::MlaWeights& w = *lw.mla;
  auto take = [&](const model::TensorView& view, CpuLinear* out) -> absl::Status {
    auto linear = Linear(view, lw, c, loader);
    if (!linear.ok()) return linear.status();
    *out = *std::move(linear);
    return absl::OkStatus();
  };
  if (m.q_lora_rank > 0) {
    if (auto s = take(*w.q_a_proj, &a.q_a_); !s.ok()) return s;
    if (auto s = take(*w.q_b_proj, &a.q_b_); !s.ok()) return s;
    auto norm = CpuWeightLoader::Floats(*w.q_a_layernorm);
    if (!norm.ok()) return norm.status();
    a.q_a_norm_ = *std::move(norm);
  } else if (auto s = take(*w.q_proj, &a.q_); !s.ok()) {
    return s;
  }
  if (auto s = take(w.kv_a_proj_with_mqa, &a.kv_a_); !s.ok()) return s;
  if (auto s = take(lw.o_proj, &a.o_); !s.ok()) return s;
  auto kv_norm = CpuWeightLoader::Floats(w.kv_a_layernorm);
  if (!kv_norm.ok()) return kv_norm.status();
  a.kv_a_norm_ = *std::move(kv_norm);
  // kv_b_proj feeds the absorbed products per head: widened to fp32, from
  // FP8 by exact dequantization (no activation quantization).
  const model::Fp8Scales* kv_b_scales = lw.Fp8ScalesOf(w.kv_b_proj);
  auto kv_b = kv_b_scales != nullptr && c.quantization
                  ? DequantizeFp8(w.kv_b_proj, *kv_b_scales, *c.quantization)
                  : CpuWeightLoader::Floats(w.kv_b_proj);
  if (!kv_b.ok()) return kv_b.status();
  a.kv_b_ = *std::move(kv_b);
  return a;
}

void CpuMlaAttention::Rope(int32_t position, float* x) const {
  const int64_t half = mla_.qk_rope_head_dim / 2;
  const float factor = static_cast<float>(mla_.rope_attention_factor);
  float rotated[kMaxRopeDim];
  // De-interleave first (transformers' apply_rotary_pos_emb_interleave),
  // then rotate_half.
  const float* y = x;
  float deinterleaved[kMaxRopeDim];
  if (mla_.rope_interleave) {
    for (int64_t i = 0; i < half; ++i) {
      deinterleaved[i] = x[2 * i];
      deinterleaved[half + i] = x[2 * i + 1];
    }
    y = deinterleaved;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq_[i];
    const float cos = std::cos(angle) * factor;
    const float sin = std::sin(angle) * factor;
    rotated[i] = y[i] * cos + (-y[half + i]) * sin;
    rotated[half + i] = y[half + i] * cos + y[i] * sin;
  }
  std::memcpy(x, rotated, sizeof(float) * 2 * half);
}

void CpuMlaAttention::AttendOne(const float* q, int64_t head, absl::Span<const int64_t> slots,
                                const MlaLatentCache& cache, MlaForm form, float* out) const {
  const int64_t dn = mla_.qk_nope_head_dim, dr = mla_.qk_rope_head_dim, dv = mla_.v_head_dim;
  const int64_t r = mla_.kv_lora_rank, L = cache.latent_dim;
  const float scale = static_cast<float>(mla_.softmax_scale);
  const float* q_nope = q;
  const float* q_pe = q + dn;
  std::vector<float> scores(slots.size());
  std::vector<float> acc;
  // This head's rows of kv_b_proj: dn rows of W_UK, then dv rows of W_UV.
  const float* w_uk = kv_b_.data() + head * mla_.kv_b_rows_per_head() * r;
  const float* w_uv = w_uk + dn * r;
  if (form == MlaForm::kAbsorbed) {
    std::vector<float> q_lat(r, 0.0f);
    for (int64_t i = 0; i < dn; ++i) {
      const float qi = q_nope[i];
      const float* row = w_uk + i * r;
      for (int64_t c = 0; c < r; ++c) q_lat[c] += qi * row[c];
    }
    for (size_t j = 0; j < slots.size(); ++j) {
      const float* latent = cache.data + slots[j] * L;
      scores[j] = scale * (Dot(q_lat.data(), latent, r) + Dot(q_pe, latent + r, dr));
    }
  } else {
    std::vector<float> k_nope(dn);
    for (size_t j = 0; j < slots.size(); ++j) {
      const float* latent = cache.data + slots[j] * L;
      for (int64_t i = 0; i < dn; ++i) k_nope[i] = Dot(w_uk + i * r, latent, r);
      scores[j] = scale * (Dot(q_nope, k_nope.data(), dn) + Dot(q_pe, latent + r, dr));
    }
  }
  float max_score = -std::numeric_limits<float>::infinity();
  for (float s : scores) max_score = std::max(max_score, s);
  float total = 0;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    total += s;
  }
  if (form == MlaForm::kAbsorbed) {
    acc.assign(r, 0.0f);
    for (size_t j = 0; j < slots.size(); ++j) {
      const float p = scores[j] / total;
      const float* latent = cache.data + slots[j] * L;
      for (int64_t c = 0; c < r; ++c) acc[c] += p * latent[c];
    }
    for (int64_t d = 0; d < dv; ++d) out[d] = Dot(w_uv + d * r, acc.data(), r);
  } else {
    std::fill(out, out + dv, 0.0f);
    for (size_t j = 0; j < slots.size(); ++j) {
      const float p = scores[j] / total;
      const float* latent = cache.data + slots[j] * L;
      for (int64_t d = 0; d < dv; ++d) out[d] += p * Dot(w_uv + d * r, latent, r);
    }
  }
}

void CpuMlaAttention::Run(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k,
                          const float* x, const ForwardBatch& batch, const MlaLatentCache& cache,
                          MlaForm form, MlaScratch* sc, float* out) const {
  const int64_t n = batch.num_tokens();
  const int64_t dn = mla_.qk_nope_head_dim, dr = mla_.qk_rope_head_dim, dv = mla_.v_head_dim;
  const int64_t r = mla_.kv_lora_rank, L = mla_.latent_dim(), qk = mla_.qk_head_dim();
  const float eps = static_cast<float>(model::kMlaNormEps);

  // Queries: [n, heads, dn + dr].
  sc->q.resize(n * heads_ * qk);
  if (mla_.q_lora_rank > 0) {
    sc->q_a.resize(n * mla_.q_lora_rank);
    q_a_.Apply(ctx, k, x, n, nullptr, sc->q_a.data());
    k.rms_norm(ctx, sc->q_a.data(), q_a_norm_.data(), n, mla_.q_lora_rank, eps, sc->q_a.data());
    q_b_.Apply(ctx, k, sc->q_a.data(), n, nullptr, sc->q.data());
  } else {
    q_.Apply(ctx, k, x, n, nullptr, sc->q.data());
  }
  // Latents: [n, r + dr] -> normalised c, roped k_pe, into the cache.
  sc->kv_a.resize(n * L);
  kv_a_.Apply(ctx, k, x, n, nullptr, sc->kv_a.data());
  sc->latent.resize(n * r);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(sc->latent.data() + t * r, sc->kv_a.data() + t * L, sizeof(float) * r);
  }
  k.rms_norm(ctx, sc->latent.data(), kv_a_norm_.data(), n, r, eps, sc->latent.data());
  for (int64_t t = 0; t < n; ++t) {
    float* k_pe = sc->kv_a.data() + t * L + r;
    Rope(batch.positions[t], k_pe);
    for (int64_t h = 0; h < heads_; ++h)
      Rope(batch.positions[t], sc->q.data() + (t * heads_ + h) * qk + dn);
    float* row = cache.data + batch.slot_mapping[t] * L;
    std::memcpy(row, sc->latent.data() + t * r, sizeof(float) * r);
    std::memcpy(row + r, k_pe, sizeof(float) * dr);
  }

  // Attention per (token, head), then o_proj.
  std::vector<int32_t> seq_of(n);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    for (int t = batch.query_start_loc[s]; t < batch.query_start_loc[s + 1]; ++t) seq_of[t] = s;
  }
  sc->attn.resize(n * heads_ * dv);
  auto run = [&](int64_t from, int64_t to) {
    std::vector<int64_t> slots;
    for (int64_t w = from; w < to; ++w) {
      const int t = static_cast<int>(w / heads_);
      const int64_t h = w % heads_;
      ContextSlots(batch, seq_of[t], t, cache.block_size, &slots);
      AttendOne(sc->q.data() + (int64_t{t} * heads_ + h) * qk, h, slots, cache, form,
                sc->attn.data() + (int64_t{t} * heads_ + h) * dv);
    }
  };
  if (ctx.pool != nullptr) {
    ctx.pool->ParallelFor(n * heads_, 1, run);
  } else {
    run(0, n * heads_);
  }
  o_.Apply(ctx, k, sc->attn.data(), n, nullptr, out);
}

}  // namespace tessera::runner
