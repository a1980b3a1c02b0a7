#include "worker/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "base/str_cat.h"

namespace tessera::model {

namespace {

absl::StatusOr<std::vector<float>> YarnInverseFrequencies(int64_t head_dim, double theta,
                                                          const RopeScaling& y) {
  if (!(y.factor >= 1.0) || y.original_max_position_embeddings < 1 || !(y.beta_fast > 0) ||
      !(y.beta_slow > 0)) {
    return absl::InvalidArgumentError(
        "yarn rope scaling needs factor >= 1, original_max_position_embeddings >= 1 and "
        "positive beta_fast / beta_slow");
  }
  // Python floats (double) for the correction range, as transformers.
  const double dim = static_cast<double>(head_dim);
  const double base = theta;
  const double original = static_cast<double>(y.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = correction_dim(y.beta_fast);
  double high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  // torch float32 from here: the scalars are rounded to float32.
  const float low_f = static_cast<float>(low);
  const float range_f = static_cast<float>(high - low);
  const float base_f = static_cast<float>(base);
  const float factor_f = static_cast<float>(y.factor);
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base_f, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / range_f, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // inv_freq_extrapolation_factor
    inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv_freq;
}

}  // namespace

double YarnMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double RopeAttentionFactor(const RopeScaling& s) {
  if (s.type != RopeScalingType::kYarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0) {
    return YarnMscale(s.factor, s.mscale) / YarnMscale(s.factor, s.mscale_all_dim);
  }
  return YarnMscale(s.factor, 1.0);
}

absl::StatusOr<std::vector<float>> RopeInverseFrequencies(int64_t head_dim, double theta,
                                                          const RopeScaling& scaling) {
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        Cat("rotary head_dim = ", head_dim, " must be even, positive and at most ", kMaxHeadDim));
  }
  if (!(theta > 0) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(Cat("rope_theta = ", theta, " must be > 0"));
  }
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in float32.
  const float base = static_cast<float>(theta);
  const float dim = static_cast<float>(head_dim);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }

  switch (scaling.type) {
    case RopeScalingType::kNone:
      return inv_freq;
    case RopeScalingType::kLinear: {
      if (!(scaling.factor >= 1.0)) {
        return absl::InvalidArgumentError(
            Cat("linear rope factor = ", scaling.factor, " must be >= 1"));
      }
      const float factor = static_cast<float>(scaling.factor);
      for (float& f : inv_freq) f /= factor;
      return inv_freq;
    }
    case RopeScalingType::kLlama3: {
      if (!(scaling.factor >= 1.0) || !(scaling.low_freq_factor > 0) ||
          !(scaling.high_freq_factor > scaling.low_freq_factor) ||
          scaling.original_max_position_embeddings < 1) {
        return absl::InvalidArgumentError(
            "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
            "original_max_position_embeddings >= 1");
      }
      // Python scalars combine with float32 tensors in float32; the two
      // wavelength thresholds are Python floats (double) that torch compares
      // against after rounding to float32.
      const double old_len = static_cast<double>(scaling.original_max_position_embeddings);
      const float low_freq_wavelen = static_cast<float>(old_len / scaling.low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(old_len / scaling.high_freq_factor);
      const float factor = static_cast<float>(scaling.factor);
      const float two_pi = static_cast<float>(2 * std::numbers::pi);
      const float old_len_f = static_cast<float>(old_len);
      const float lo = static_cast<float>(scaling.low_freq_factor);
      const float range = static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
      for (float& f : inv_freq) {
        const float wavelen = two_pi / f;
        if (wavelen > low_freq_wavelen) {
          f = f / factor;
        } else if (!(wavelen < high_freq_wavelen)) {
          const float smooth = (old_len_f / wavelen - lo) / range;
          f = (1.0f - smooth) * f / factor + smooth * f;
        }
      }
      return inv_freq;
    }
    case RopeScalingType::kYarn:
      return YarnInverseFrequencies(head_dim, theta, scaling);
  }
  return absl::InternalError("unknown rope scaling type");
}

absl::StatusOr<std::vector<float>> RopeInverseFrequencies(const ModelConfig& config) {
  return RopeInverseFrequencies(config.rotary_dim(), config.rope_theta, config.rope_scaling);
}

}  // namespace tessera::model
