#include "worker/runner/cpu_linear.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::runner {
namespace {

namespace kc = ::tessera::kernels::cpu;

kc::Fp8Activation ActivationOf(const model::QuantizationConfig& q, float input_scale) {
  switch (q.activation) {
    case model::ActivationQuant::kNone:
      return {kc::Fp8ActivationMode::kNone, 0, 1.f};
    case model::ActivationQuant::kDynamicTokenGroup:
      return {kc::Fp8ActivationMode::kDynamicGroup, q.activation_group, 1.f};
    case model::ActivationQuant::kDynamicToken:
      return {kc::Fp8ActivationMode::kDynamicToken, 0, 1.f};
    case model::ActivationQuant::kStaticTensor:
      return {kc::Fp8ActivationMode::kStatic, 0, input_scale};
  }
  return {};
}

// One FP8 checkpoint tensor as a part: the weight in place, the scales
// expanded to [rows, ceil(cols / block)] (block = 128, or cols for tensor
// and channel scales).
absl::StatusOr<CpuLinear::Fp8Part> Fp8PartOf(const model::TensorView& w, const model::Fp8Scales& s,
                                             const model::QuantizationConfig& q,
                                             CpuWeightLoader* loader) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  absl::StatusOr<std::vector<float>> grid = model::ToFloat32(s.weight_scale);
  if (!grid.ok()) return grid.status();
  const bool block = q.weight_strategy == model::WeightScaleStrategy::kBlock;
  kc::Fp8WeightMatrix m{reinterpret_cast<const uint8_t*>(w.data), rows, cols, nullptr,
                        block ? q.block_in : cols};
  const int64_t per_row = m.scale_cols();
  std::vector<float> scales(static_cast<size_t>(rows * per_row));
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t j = 0; j < per_row; ++j) {
      switch (q.weight_strategy) {
        case model::WeightScaleStrategy::kTensor:
          scales[o * per_row + j] = (*grid)[0];
          break;
        case model::WeightScaleStrategy::kChannel:
          scales[o * per_row + j] = (*grid)[o];
          break;
        case model::WeightScaleStrategy::kBlock:
          scales[o * per_row + j] = (*grid)[(o / q.block_out) * per_row + j];
          break;
      }
    }
  }
  m.scales = loader->OwnFloats(std::move(scales));
  float input_scale = 1.f;
  if (s.input_scale) {
    absl::StatusOr<std::vector<float>> v = model::ToFloat32(*s.input_scale);
    if (!v.ok()) return v.status();
    input_scale = (*v)[0];
  }
  CpuLinear::Fp8Part part{m, ActivationOf(q, input_scale), 0};
  if (absl::Status st = kc::ValidateFp8Gemm(part.weight, part.activation); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(w.name, ": ", st.message()));
  }
  return part;
}

}  // namespace

void CpuLinear::Apply(const kc::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
                      int64_t n, const float* bias, float* y) const {
  if (!is_fp8()) {
    k.gemm(ctx, x, n, dense, bias, y);
    return;
  }
  for (const Fp8Part& p : fp8) {
    k.fp8_gemm(ctx, x, n, p.weight, p.activation, bias ? bias + p.first_row : nullptr,
               y + p.first_row, rows);
  }
}

absl::StatusOr<CpuLinear> CpuLinear::Prepare(std::initializer_list<const model::TensorView*> parts,
                                             const model::LayerWeights& layer,
                                             const std::optional<model::QuantizationConfig>& quant,
                                             CpuWeightLoader* loader) {
  CpuLinear linear;
  linear.cols = (*parts.begin())->shape[1];
  size_t quantized = 0;
  for (const model::TensorView* p : parts) {
    linear.rows += p->shape[0];
    quantized += layer.Fp8ScalesOf(*p) != nullptr;
  }
  if (quantized == 0) {
    absl::StatusOr<kc::WeightMatrix> dense =
        parts.size() == 1 ? loader->Matrix(**parts.begin()) : loader->Fuse(parts);
    if (!dense.ok()) return dense.status();
    linear.dense = *dense;
    return linear;
  }
  if (quantized != parts.size() || !quant) {
    std::string names;
    for (const model::TensorView* p : parts)
      absl::StrAppend(&names, names.empty() ? "" : ", ", p->name);
    return absl::UnimplementedError(absl::StrCat(
        "fused linear of ", names, " mixes FP8 and unquantized weights (not supported)"));
  }
  int64_t first_row = 0;
  for (const model::TensorView* p : parts) {
    absl::StatusOr<Fp8Part> part = Fp8PartOf(*p, *layer.Fp8ScalesOf(*p), *quant, loader);
    if (!part.ok()) return part.status();
    part->first_row = first_row;
    first_row += p->shape[0];
    linear.fp8.push_back(*part);
  }
  return linear;
}

}  // namespace tessera::runner
