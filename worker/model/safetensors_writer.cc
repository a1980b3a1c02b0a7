#include "worker/model/safetensors_writer.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "base/str_cat.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "nlohmann/json.hpp"
#include "worker/model/tensor.h"

namespace tessera::model {
namespace {

void AppendU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xFF));
  out->push_back(static_cast<char>(v >> 8));
}

}  // namespace

absl::StatusOr<TensorToWrite> MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                         absl::Span<const float> values) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(Cat("tensor \"", name, "\": shape ", ShapeString(shape),
                                          " needs ", n, " values, got ", values.size()));
  }
  TensorToWrite t{std::move(name), dtype, std::move(shape), {}};
  switch (dtype) {
    case DType::kF32:
      t.bytes.resize(values.size() * 4);
      if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
      return t;
    case DType::kBF16:
      for (float v : values) AppendU16(&t.bytes, FloatToBFloat16(v));
      return t;
    case DType::kF16:
      for (float v : values) AppendU16(&t.bytes, FloatToHalf(v));
      return t;
    case DType::kF8E4M3:
      for (float v : values) t.bytes.push_back(static_cast<char>(kernels::cpu::FloatToE4m3(v)));
      return t;
    default:
      return absl::InvalidArgumentError(
          Cat("MakeTensor supports F32, F16, BF16 and F8_E4M3, not ", DTypeName(dtype)));
  }
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          Cat("tensor name \"", t.name, "\" is empty, reserved or repeated"));
    }
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            Cat("tensor \"", t.name, "\" has shape ", ShapeString(t.shape)));
      }
      n *= static_cast<uint64_t>(d);
    }
    if (n * DTypeSize(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(Cat("tensor \"", t.name, "\": ", t.bytes.size(),
                                            " bytes do not match shape ", ShapeString(t.shape),
                                            " of ", DTypeName(t.dtype)));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out += json;
  for (const TensorToWrite& t : tensors) out += t.bytes;
  return out;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> image = SerializeSafetensors(tensors, metadata);
  if (!image.ok()) return image.status();
  return WriteBinaryFile(path, *image);
}

absl::Status WriteBinaryFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(Cat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace tessera::model
