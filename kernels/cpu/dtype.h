// Element types of weight tensors and exact scalar conversions between them.
//
// Weights arrive from safetensors files as bf16, fp16 or fp32; every CPU
// kernel computes in fp32. `bf16_t` and `fp16_t` wrap the raw 16-bit
// patterns so that kernels can overload on the storage type.
//
// Thread-safety: everything here is a pure function or a plain value type.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::kernels::cpu {

enum class DType { kF32, kF16, kBF16 };

inline std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// Raw IEEE binary16 and bfloat16 bit patterns.
struct fp16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
static_assert(sizeof(fp16_t) == 2 && sizeof(bf16_t) == 2);

// bf16 -> f32 is exact: the bf16 pattern is the top half of the f32 pattern.
inline float Bf16ToF32(bf16_t h) { return std::bit_cast<float>(uint32_t{h.bits} << 16); }

// f32 -> bf16, round to nearest even; NaN stays a quiet NaN.
inline bf16_t F32ToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((x >> 16) | 0x40)};
  x += 0x7fffu + ((x >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(x >> 16)};
}

// f16 -> f32 is exact, including subnormals, infinities and NaN.
inline float F16ToF32(fp16_t h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in f32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

// f32 -> f16, round to nearest even; overflow gives infinity.
inline fp16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to even.
    const float units = std::bit_cast<float>(abs) * 0x1p24f;
    return fp16_t{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(units)))};
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return fp16_t{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

inline float ToF32(float v) { return v; }
inline float ToF32(bf16_t v) { return Bf16ToF32(v); }
inline float ToF32(fp16_t v) { return F16ToF32(v); }

}  // namespace tessera::kernels::cpu
