#include "worker/model/rope.h"

#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "base/str_cat.h"

namespace tessera::model {

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
  }
  return absl::InternalError("unknown rope scaling type");
}

absl::StatusOr<std::vector<float>> RopeInverseFrequencies(const ModelConfig& config) {
  return RopeInverseFrequencies(config.rotary_dim(), config.rope_theta, config.rope_scaling);
}

}  // namespace tessera::model
