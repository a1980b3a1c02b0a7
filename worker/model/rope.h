// Rotary position embedding (RoPE) tables: the inverse frequencies the
// attention kernels take, computed exactly as Hugging Face transformers does
// for the supported rope types.
//
// Convention (transformers' `rotate_half`, used by every supported model):
// a head vector x of size head_dim is rotated in pairs (x[i], x[i + d/2]) for
// i < d/2, by the angle  theta_i(p) = p * inv_freq[i]  at position p:
//   x'[i]       = x[i] * cos - x[i + d/2] * sin
//   x'[i + d/2] = x[i + d/2] * cos + x[i] * sin
// transformers forms p * inv_freq[i] as a float32 product (both operands
// float32) and takes cos/sin in float32; no attention scaling applies to the
// types supported here.
//
// Inverse frequencies, all arithmetic in float32 as transformers does (d =
// head_dim, base = rope_theta):
//   default: inv_freq[i] = 1 / base^((2i) / d),   i = 0 .. d/2 - 1
//   linear:  inv_freq[i] = default[i] / factor
//   llama3:  with L = original_max_position_embeddings, lo = low_freq_factor,
//            hi = high_freq_factor, wavelen = 2*pi / default[i]:
//              wavelen < L / hi  -> default[i]             (high frequencies)
//              wavelen > L / lo  -> default[i] / factor    (low frequencies)
//              otherwise         -> (1 - s) * default[i] / factor + s * default[i]
//                                   with s = (L / wavelen - lo) / (hi - lo)
//   yarn:    (transformers' _compute_yarn_parameters, DeepSeek-V3) with
//            f = factor, L = original_max_position_embeddings and
//            corr(r) = d * ln(L / (r * 2 pi)) / (2 ln base):
//              low = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), d - 1)
//              (no floor/ceil when truncate is false; high += 0.001 if equal)
//              ramp[i] = clamp((i - low) / (high - low), 0, 1),  e = 1 - ramp[i]
//              inv_freq[i] = default[i] / f * (1 - e) + default[i] * e
//            (computed as 1 / (f * base^(2i/d)) and 1 / base^(2i/d), float32);
//            cos and sin are then multiplied by RopeAttentionFactor().
// Results agree with transformers' float32 tables to within 1 ulp (bit-exact
// for 5 of the 6 reference tables in testdata/; the rest differ where torch's
// vectorised pow() rounds differently from std::pow).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"

namespace tessera::model {

// head_dim / 2 inverse frequencies. INVALID_ARGUMENT unless head_dim is even,
// positive and <= kMaxHeadDim, theta > 0 and the scaling parameters are valid (see
// RopeScaling).
absl::StatusOr<std::vector<float>> RopeInverseFrequencies(int64_t head_dim, double theta,
                                                          const RopeScaling& scaling);

// For a model: rotary_dim() / 2 frequencies from config.rotary_dim() (head_dim
// unless a partial rotary factor applies, as GLM-4.5's), rope_theta and
// rope_scaling. transformers computes partial RoPE's table with d = rotary_dim.
absl::StatusOr<std::vector<float>> RopeInverseFrequencies(const ModelConfig& config);

// DeepSeek's yarn_get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double YarnMscale(double scale, double mscale);

// The factor transformers multiplies cos and sin by: 1 except for yarn,
// where it is attention_factor when given, else mscale(factor, mscale) /
// mscale(factor, mscale_all_dim) when both are set, else mscale(factor, 1).
// (transformers 5 takes `factor` as written; some 4.x releases replaced it
// by max_position_embeddings / original_max_position_embeddings, which
// real DeepSeek-V3 and Kimi K2 configs make equal.)
double RopeAttentionFactor(const RopeScaling& scaling);

}  // namespace tessera::model
