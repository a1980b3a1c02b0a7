// The float8 e4m3fn format of FP8 checkpoints (torch.float8_e4m3fn,
// safetensors "F8_E4M3"): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
// bits, no infinities, one NaN pattern per sign (S.1111.111), largest finite
// value 448, smallest subnormal 2^-9. Exact conversions to float32, and the
// rounding of float32 to e4m3 that torch's `.to(torch.float8_e4m3fn)` does
// (round to nearest even; a value that rounds past 448 becomes NaN, so
// quantizers clamp to +-448 first).
//
// Header-only so that worker/model (which links no kernels) can decode scales
// and weights in its checks. Thread-safety: pure functions.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tessera::kernels::cpu {

// The largest finite e4m3fn value.
inline constexpr float kE4m3Max = 448.0f;

// e4m3fn bits -> float32 (exact; NaN for S.1111.111).
constexpr float E4m3ToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: m/8 * 2^-6
  } else {
    // (1 + m/8) * 2^(e - 7), built from the float32 bit pattern.
    magnitude = std::bit_cast<float>(static_cast<uint32_t>(exponent - 7 + 127) << 23 |
                                     static_cast<uint32_t>(mantissa) << 20);
  }
  return negative ? -magnitude : magnitude;
}

// All 256 decodings, for table lookups in kernels.
inline const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = E4m3ToFloat(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// float32 -> e4m3fn bits, round to nearest even. NaN, infinities and values
// whose rounding exceeds 448 give NaN (0x7F / 0xFF), as torch does.
inline uint8_t FloatToE4m3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | 0x7F;  // inf or NaN
  const float magnitude = std::bit_cast<float>(abs);
  if (magnitude < 0x1p-6f) {
    // Subnormal range: a multiple of 2^-9, rounded to even (default rounding
    // mode); 8 * 2^-9 = 2^-6 is the smallest normal, encoded as 0x08.
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 0x1p9f));
  }
  // Normal: keep 3 of the 23 mantissa bits, round to nearest even.
  const uint32_t rounded = abs + 0x7FFFFu + ((abs >> 20) & 1u);
  const int exponent = static_cast<int>(rounded >> 23) - 127 + 7;
  const uint32_t mantissa = (rounded >> 20) & 0x7u;
  if (exponent > 15 || (exponent == 15 && mantissa == 7)) return sign | 0x7F;
  return sign | static_cast<uint8_t>(exponent << 3 | mantissa);
}

}  // namespace tessera::kernels::cpu
