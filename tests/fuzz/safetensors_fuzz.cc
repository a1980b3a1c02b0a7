// libFuzzer target: the safetensors parser (header length, JSON header,
// layout validation) and the tensor accessors on whatever it accepts. Any
// crash, sanitizer report or broken invariant is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/model/safetensors.h"
#include "worker/model/tensor.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::model;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(std::move(bytes), "fuzz");
  if (!file.ok()) {
    Check(!file.status().message().empty());
    return 0;
  }
  const SafetensorsFile& f = **file;
  const std::byte* begin = f.tensors().empty() ? nullptr : f.tensors().front().data;
  uint64_t covered = 0;
  for (const TensorView& t : f.tensors()) {
    // Every accepted view lies inside the data section and matches its shape.
    Check(t.size_bytes == static_cast<size_t>(t.num_elements()) * DTypeSize(t.dtype));
    Check(f.header().data_offset() + covered + t.size_bytes <= f.file_size());
    Check(t.data == begin + covered);
    covered += t.size_bytes;
    Check(f.Find(t.name) == &t);
    if (t.size_bytes > (1 << 16)) continue;
    // Conversions and slices either work or fail cleanly.
    (void)ToFloat32(t);
    if (t.rank() > 0) {
      const int dim = static_cast<int>(t.size_bytes % static_cast<size_t>(t.rank()));
      const int64_t extent = t.shape[dim];
      const int64_t start = extent / 3;
      (void)ReadSliceAsFloat32(t, dim, start, extent - start);
      (void)ReadSliceAsFloat32(t, dim, start, extent + 1);  // out of range: an error
      (void)SliceRows(t, 0, t.shape[0]);
    }
  }
  Check(f.header().data_offset() + covered == f.file_size());
  return 0;
}
