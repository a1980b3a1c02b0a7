#include "worker/model/dtype.h"

#include <array>
#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "base/str_cat.h"

namespace tessera::model {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
}};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // Unreachable for valid enum values.
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

bool IsFloatWeightDType(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF32;
}

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  std::string names;
  for (const DTypeInfo& info : kDTypes) names += Cat(names.empty() ? "" : ", ", info.name);
  return absl::InvalidArgumentError(
      Cat("unsupported dtype \"", name, "\" (supported: ", names, ")"));
}

absl::StatusOr<DType> ParseTorchDType(std::string_view name) {
  if (name == "float32" || name == "float") return DType::kF32;
  if (name == "float16" || name == "half") return DType::kF16;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  return absl::InvalidArgumentError(
      Cat("unsupported torch_dtype \"", name, "\" (supported: float32, float16, bfloat16)"));
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  uint32_t out;
  if (exponent == 0x1F) {
    out = sign | 0x7F800000u | (mantissa << 13);  // inf or NaN (payload kept)
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);  // 127 - 15 = 112
  } else if (mantissa == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal half: normalise into a float32 normal number.
    int32_t e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    out = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(out);
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  const int32_t exponent = static_cast<int32_t>(abs >> 23) - 127;
  if (exponent >= -14) {
    // Normal half: keep 10 mantissa bits, round to nearest even.
    const uint32_t mantissa = abs & 0x7FFFFFu;
    uint32_t half = (static_cast<uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
    return sign | static_cast<uint16_t>(half);
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal
  // Subnormal half: value = m * 2^-24 with m < 1024.
  const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
  const int shift = -exponent - 1;                          // 14 .. 24 -> m = sig >> (shift)
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

}  // namespace tessera::model
