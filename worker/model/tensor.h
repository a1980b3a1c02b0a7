// TensorView: a read-only, non-owning view of one checkpoint tensor (dtype,
// shape, bytes), plus conversions to float32 and slice reads that touch only
// the bytes of the slice (for tensor-parallel shards).
//
// Layout: dense row-major (C order), little-endian, no strides: the element at
// index (i0, ..., in) is at byte ((i0 * d1 + i1) * d2 + ...) * DTypeSize.
// `data` is NOT guaranteed to be aligned to the element size (safetensors only
// pads the header to 8 bytes, and some writers do not); read elements with
// memcpy, or check `IsAligned()` before casting the pointer.
//
// Lifetime: a view points into the memory of the SafetensorsFile (or
// Checkpoint) that produced it and is valid while that object lives.
//
// Thread-safety: views are immutable; every function here only reads the
// tensor bytes, so any number of threads may use the same view concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/model/dtype.h"

namespace tessera::model {

struct TensorView {
  std::string name;                 // checkpoint name, e.g. "model.norm.weight"
  DType dtype = DType::kF32;        // element type
  std::vector<int64_t> shape;       // every entry >= 0; empty = scalar
  const std::byte* data = nullptr;  // first byte (may be null when size_bytes == 0)
  size_t size_bytes = 0;            // == num_elements() * DTypeSize(dtype)

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // Product of the shape (1 for a scalar).
  int64_t num_elements() const;
  absl::Span<const std::byte> bytes() const { return {data, size_bytes}; }
  // True when `data` is a multiple of the element size.
  bool IsAligned() const;
};

// "[4096, 128]" (and "[]" for a scalar).
std::string ShapeString(absl::Span<const int64_t> shape);

// Converts `count` contiguous elements of `dtype` at `src` to float32.
// F32, F16, BF16 and F64 are supported; other dtypes give UNIMPLEMENTED.
absl::Status ConvertToFloat32(DType dtype, const std::byte* src, size_t count, float* dst);

// Whole tensor to float32, in row-major order.
// REQUIRES: out.size() == t.num_elements() (else INVALID_ARGUMENT).
absl::Status CopyToFloat32(const TensorView& t, absl::Span<float> out);
absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& t);

// Zero-copy narrowing of dimension 0: rows [start, start + len). The result
// views the same bytes and is named "<name>[start:start+len]".
absl::StatusOr<TensorView> SliceRows(const TensorView& t, int64_t start, int64_t len);

// The shape of `t` narrowed to [start, start + len) along `dim`, after
// checking 0 <= dim < rank, start >= 0, len >= 0, start + len <= shape[dim].
absl::StatusOr<std::vector<int64_t>> SliceShape(const TensorView& t, int dim, int64_t start,
                                                int64_t len);

// Copies the narrowed tensor (see SliceShape) into `out` in the tensor's own
// dtype, row-major. Reads only the bytes that belong to the slice, so for
// dim 0 it reads one contiguous range and for dim 1 of a matrix `len`
// elements of every row. Used to load a tensor-parallel shard (column
// parallel: dim 0 of an [out, in] Linear weight; row parallel: dim 1).
// REQUIRES: out.size() == product(SliceShape) * DTypeSize(t.dtype).
absl::Status ReadSlice(const TensorView& t, int dim, int64_t start, int64_t len,
                       absl::Span<std::byte> out);

// As ReadSlice, converting to float32 (dtype support as ConvertToFloat32).
absl::StatusOr<std::vector<float>> ReadSliceAsFloat32(const TensorView& t, int dim, int64_t start,
                                                      int64_t len);

}  // namespace tessera::model
