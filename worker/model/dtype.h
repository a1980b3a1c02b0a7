// Element types of checkpoint tensors, their safetensors spellings and byte
// sizes, and scalar conversions of the 16-bit float formats to float32.
//
// Thread-safety: all functions are pure and safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::model {

// Every dtype the safetensors format defines with a whole number of bytes
// per element. Sub-byte formats (F4, F6_*) and E8M0 are not accepted.
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E4M3,  // "F8_E4M3" (float8_e4m3fn)
  kF8E5M2,  // "F8_E5M2"
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

// The safetensors spelling: "BOOL", "U8", ..., "BF16", "F32", ...
std::string_view DTypeName(DType dtype);

// Bytes per element (1, 2, 4 or 8).
size_t DTypeSize(DType dtype);

// True for F16, BF16 and F32: the types model weights may have.
bool IsFloatWeightDType(DType dtype);

// Parses a safetensors dtype string (exact, case-sensitive). An unknown
// string gives INVALID_ARGUMENT naming it and listing the accepted ones.
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);

// Parses a `torch_dtype` value of config.json: "float32", "float16",
// "bfloat16" (also "float", "half", "bf16" spellings torch accepts).
absl::StatusOr<DType> ParseTorchDType(std::string_view name);

// IEEE binary16 bits -> float32 (exact; subnormals, inf and NaN preserved).
float HalfToFloat(uint16_t bits);

// bfloat16 bits -> float32 (exact: bf16 is the upper half of a float32).
float BFloat16ToFloat(uint16_t bits);

// float32 -> bfloat16 bits, rounding to nearest even (NaN stays NaN).
uint16_t FloatToBFloat16(float value);

// float32 -> IEEE binary16 bits, rounding to nearest even; overflow gives
// inf, tiny values become subnormal or zero, NaN stays NaN.
uint16_t FloatToHalf(float value);

}  // namespace tessera::model
