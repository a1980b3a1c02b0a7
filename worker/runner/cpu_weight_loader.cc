#include "worker/runner/cpu_weight_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::runner {
namespace {

namespace kc = ::tessera::kernels::cpu;

absl::StatusOr<kc::DType> KernelDType(model::DType t, const std::string& name) {
  switch (t) {
    case model::DType::kF32:
      return kc::DType::kF32;
    case model::DType::kF16:
      return kc::DType::kF16;
    case model::DType::kBF16:
      return kc::DType::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": weights must be F32, F16 or BF16 for the CPU backend"));
  }
}

}  // namespace

const std::byte* CpuWeightLoader::Own(std::vector<std::byte> bytes) {
  owned_.push_back(std::make_unique<std::vector<std::byte>>(std::move(bytes)));
  return owned_.back()->data();
}

const float* CpuWeightLoader::OwnFloats(std::vector<float> values) {
  owned_floats_.push_back(std::make_unique<std::vector<float>>(std::move(values)));
  return owned_floats_.back()->data();
}

absl::StatusOr<kc::WeightMatrix> CpuWeightLoader::Matrix(const model::TensorView& t) {
  auto dtype = KernelDType(t.dtype, t.name);
  if (!dtype.ok()) return dtype.status();
  kc::WeightMatrix m{t.data, *dtype, t.shape[0], t.shape[1]};
  if (!t.IsAligned()) m.data = Own(std::vector<std::byte>(t.data, t.data + t.size_bytes));
  return m;
}

absl::StatusOr<kc::WeightMatrix> CpuWeightLoader::Fuse(
    std::initializer_list<const model::TensorView*> parts) {
  const model::TensorView& first = **parts.begin();
  bool same = true;
  int64_t rows = 0;
  for (const model::TensorView* p : parts) {
    same &= p->dtype == first.dtype;
    rows += p->shape[0];
  }
  const int64_t cols = first.shape[1];
  std::vector<std::byte> buf;
  kc::WeightMatrix m{nullptr, kc::DType::kF32, rows, cols};
  if (same) {
    auto dtype = KernelDType(first.dtype, first.name);
    if (!dtype.ok()) return dtype.status();
    m.dtype = *dtype;
    for (const model::TensorView* p : parts)
      buf.insert(buf.end(), p->data, p->data + p->size_bytes);
  } else {
    buf.resize(static_cast<size_t>(rows * cols) * sizeof(float));
    float* dst = reinterpret_cast<float*>(buf.data());
    for (const model::TensorView* p : parts) {
      if (auto s = model::CopyToFloat32(*p, absl::MakeSpan(dst, p->num_elements())); !s.ok()) {
        return s;
      }
      dst += p->num_elements();
    }
  }
  m.data = Own(std::move(buf));
  return m;
}

absl::StatusOr<kc::WeightMatrix> CpuWeightLoader::Columns(const model::TensorView& t,
                                                          parallel::Range r) {
  if (r.start == 0 && r.size == t.shape[1]) return Matrix(t);
  auto dtype = KernelDType(t.dtype, t.name);
  if (!dtype.ok()) return dtype.status();
  std::vector<std::byte> buf(static_cast<size_t>(t.shape[0] * r.size) * model::DTypeSize(t.dtype));
  if (auto s = model::ReadSlice(t, 1, r.start, r.size, absl::MakeSpan(buf)); !s.ok()) return s;
  return kc::WeightMatrix{Own(std::move(buf)), *dtype, t.shape[0], r.size};
}

absl::StatusOr<model::TensorView> CpuWeightLoader::Rows(const model::TensorView& t,
                                                        parallel::Range r) {
  if (r.start == 0 && r.size == t.shape[0]) return t;
  return model::SliceRows(t, r.start, r.size);
}

absl::StatusOr<std::vector<float>> CpuWeightLoader::Floats(const model::TensorView& t,
                                                           parallel::Range r) {
  return model::ReadSliceAsFloat32(t, 0, r.start, r.size);
}

absl::StatusOr<std::vector<float>> CpuWeightLoader::Floats(const model::TensorView& t) {
  return model::ToFloat32(t);
}

absl::StatusOr<std::vector<float>> CpuWeightLoader::Floats(
    const std::optional<model::TensorView>& t) {
  if (!t) return std::vector<float>();
  return model::ToFloat32(*t);
}

}  // namespace tessera::runner
