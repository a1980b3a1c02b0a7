// Writes safetensors files: for tests that need synthetic checkpoints, for
// fixtures and for tools. The output is what the reference writer produces:
// tensors laid out in the given order without gaps, the JSON header padded
// with spaces to a multiple of 8 bytes so the data section is 8-aligned.
//
// Thread-safety: pure functions (WriteSafetensorsFile writes one file).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/model/dtype.h"

namespace tessera::model {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian elements, row-major
};

// float32 values -> a tensor of `dtype` (F32, F16, BF16 or F8_E4M3; rounding
// to nearest even; F8_E4M3 values beyond +-448 become NaN, as in torch). INVALID_ARGUMENT when the
// value count does not match the shape or the dtype is not one of those three.
absl::StatusOr<TensorToWrite> MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                         absl::Span<const float> values);

// The complete file image. INVALID_ARGUMENT for an empty or duplicate name,
// a negative dimension, or bytes that do not match shape x dtype.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// Writes `contents` to `path` (replacing it). Used for fixtures and tests.
absl::Status WriteBinaryFile(const std::string& path, std::string_view contents);

}  // namespace tessera::model
