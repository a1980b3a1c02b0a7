#include "worker/model/tensor.h"

#include <bit>
#include <cstring>

#include "base/str_cat.h"

namespace tessera::model {
namespace {

template <typename T>
T LoadUnaligned(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Calls fn(src, element_count, dst_element_offset) for every contiguous run
// of the slice, in row-major order of the result.
template <typename Fn>
absl::Status ForEachSliceRun(const TensorView& t, int dim, int64_t start, int64_t len, Fn fn) {
  int64_t outer = 1;
  for (int i = 0; i < dim; ++i) outer *= t.shape[i];
  int64_t inner = 1;
  for (int64_t i = dim + 1; i < t.rank(); ++i) inner *= t.shape[i];
  const size_t esize = DTypeSize(t.dtype);
  const int64_t run = len * inner;
  if (run == 0 || outer == 0) return absl::OkStatus();
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t src_elem = (o * t.shape[dim] + start) * inner;
    absl::Status status = fn(t.data + static_cast<size_t>(src_elem) * esize,
                             static_cast<size_t>(run), static_cast<size_t>(o * run));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// Rejects views whose shape and byte size disagree (only hand-built views can;
// the loaders produce consistent ones), so that no read leaves the bytes.
absl::Status CheckView(const TensorView& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return absl::InvalidArgumentError(
          Cat("tensor \"", t.name, "\" has an invalid shape ", ShapeString(t.shape)));
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, DTypeSize(t.dtype), &bytes) || bytes != t.size_bytes ||
      (t.data == nullptr && bytes != 0)) {
    return absl::InvalidArgumentError(Cat("tensor \"", t.name, "\" of shape ", ShapeString(t.shape),
                                          " and dtype ", DTypeName(t.dtype), " does not match its ",
                                          t.size_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorView::IsAligned() const {
  return reinterpret_cast<uintptr_t>(data) % DTypeSize(dtype) == 0;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += Cat(i == 0 ? "" : ", ", shape[i]);
  return out + "]";
}

absl::Status ConvertToFloat32(DType dtype, const std::byte* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(dst, src, count * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(LoadUnaligned<uint16_t>(src + 2 * i));
      return absl::OkStatus();
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        dst[i] = BFloat16ToFloat(LoadUnaligned<uint16_t>(src + 2 * i));
      }
      return absl::OkStatus();
    case DType::kF64:
      for (size_t i = 0; i < count; ++i) {
        dst[i] = static_cast<float>(LoadUnaligned<double>(src + 8 * i));
      }
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(
          Cat("conversion of dtype ", DTypeName(dtype),
              " to float32 is not supported (supported: F32, F16, BF16, F64)"));
  }
}

absl::Status CopyToFloat32(const TensorView& t, absl::Span<float> out) {
  if (absl::Status s = CheckView(t); !s.ok()) return s;
  const int64_t n = t.num_elements();
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(
        Cat("tensor \"", t.name, "\" has ", n, " elements but the output holds ", out.size()));
  }
  absl::Status status = ConvertToFloat32(t.dtype, t.data, static_cast<size_t>(n), out.data());
  if (!status.ok())
    return absl::Status(status.code(), Cat("tensor \"", t.name, "\": ", status.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& t) {
  if (absl::Status s = CheckView(t); !s.ok()) return s;
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  absl::Status status = CopyToFloat32(t, absl::MakeSpan(out));
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<int64_t>> SliceShape(const TensorView& t, int dim, int64_t start,
                                                int64_t len) {
  if (absl::Status s = CheckView(t); !s.ok()) return s;
  if (dim < 0 || dim >= t.rank()) {
    return absl::InvalidArgumentError(Cat("tensor \"", t.name, "\" of shape ", ShapeString(t.shape),
                                          ": slice dim ", dim, " is out of range"));
  }
  if (start < 0 || len < 0 || start > t.shape[dim] || len > t.shape[dim] - start) {
    return absl::OutOfRangeError(Cat("tensor \"", t.name, "\" of shape ", ShapeString(t.shape),
                                     ": slice [", start, ", ", start, "+", len, ") along dim ", dim,
                                     " exceeds its extent ", t.shape[dim]));
  }
  std::vector<int64_t> shape = t.shape;
  shape[dim] = len;
  return shape;
}

absl::StatusOr<TensorView> SliceRows(const TensorView& t, int64_t start, int64_t len) {
  absl::StatusOr<std::vector<int64_t>> shape = SliceShape(t, 0, start, len);
  if (!shape.ok()) return shape.status();
  TensorView out;
  out.name = Cat(t.name, "[", start, ":", start + len, "]");
  out.dtype = t.dtype;
  out.shape = *std::move(shape);
  const size_t row_bytes = t.shape[0] == 0 ? 0 : t.size_bytes / static_cast<size_t>(t.shape[0]);
  out.data = t.data == nullptr ? nullptr : t.data + static_cast<size_t>(start) * row_bytes;
  out.size_bytes = static_cast<size_t>(len) * row_bytes;
  return out;
}

absl::Status ReadSlice(const TensorView& t, int dim, int64_t start, int64_t len,
                       absl::Span<std::byte> out) {
  absl::StatusOr<std::vector<int64_t>> shape = SliceShape(t, dim, start, len);
  if (!shape.ok()) return shape.status();
  int64_t n = 1;
  for (int64_t d : *shape) n *= d;
  const size_t esize = DTypeSize(t.dtype);
  if (out.size() != static_cast<size_t>(n) * esize) {
    return absl::InvalidArgumentError(Cat("tensor \"", t.name, "\": slice needs ",
                                          static_cast<size_t>(n) * esize,
                                          " bytes but the output holds ", out.size()));
  }
  return ForEachSliceRun(t, dim, start, len,
                         [&](const std::byte* src, size_t count, size_t dst_offset) {
                           std::memcpy(out.data() + dst_offset * esize, src, count * esize);
                           return absl::OkStatus();
                         });
}

absl::StatusOr<std::vector<float>> ReadSliceAsFloat32(const TensorView& t, int dim, int64_t start,
                                                      int64_t len) {
  absl::StatusOr<std::vector<int64_t>> shape = SliceShape(t, dim, start, len);
  if (!shape.ok()) return shape.status();
  int64_t n = 1;
  for (int64_t d : *shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  absl::Status status = ForEachSliceRun(
      t, dim, start, len, [&](const std::byte* src, size_t count, size_t dst_offset) {
        return ConvertToFloat32(t.dtype, src, count, out.data() + dst_offset);
      });
  if (!status.ok()) {
    return absl::Status(status.code(), Cat("tensor \"", t.name, "\": ", status.message()));
  }
  return out;
}

}  // namespace tessera::model
