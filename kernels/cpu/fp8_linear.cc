#include "kernels/cpu/fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/thread_pool.h"

namespace tessera::kernels::cpu {
namespace {

// Smallest amax a dynamic group is scaled by (see the header).
constexpr float kAmaxFloor = 1e-10f;

float QuantizeOne(float x, float scale) {
  const float q = std::clamp(x / scale, -kE4m3Max, kE4m3Max);
  return E4m3Table()[FloatToE4m3(q)];
}

// Features per partial sum: the finer of the two scale granularities.
int64_t ChunkOf(const Fp8WeightMatrix& w, const Fp8Activation& a) {
  return std::min(std::min(w.scale_block, ActivationGroup(a, w.cols)), w.cols);
}

// One output: the chunked, scaled sum over K of quantized row xq (scales xs)
// and decoded weight row wrow (scales ws).
float Dot(const float* xq, const float* xs, const float* wrow, const float* ws, int64_t cols,
          int64_t chunk, int64_t group, int64_t block) {
  float acc = 0;
  for (int64_t start = 0; start < cols; start += chunk) {
    const int64_t end = std::min(cols, start + chunk);
    float partial = 0;
    for (int64_t i = start; i < end; ++i) partial += xq[i] * wrow[i];
    acc += partial * xs[start / group] * ws[start / block];
  }
  return acc;
}

void DecodeRow(const Fp8WeightMatrix& w, int64_t o, float* out) {
  const std::array<float, 256>& table = E4m3Table();
  const uint8_t* row = w.data + o * w.cols;
  for (int64_t i = 0; i < w.cols; ++i) out[i] = table[row[i]];
}

}  // namespace

int64_t ActivationGroup(const Fp8Activation& a, int64_t cols) {
  return a.mode == Fp8ActivationMode::kDynamicGroup ? std::min(a.group, cols) : cols;
}

void QuantizeActivations(const float* x, int64_t m, int64_t cols, const Fp8Activation& a, float* xq,
                         float* xs) {
  const int64_t group = ActivationGroup(a, cols);
  const int64_t groups = (cols + group - 1) / group;
  for (int64_t t = 0; t < m; ++t) {
    const float* row = x + t * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t start = g * group, end = std::min(cols, start + group);
      float scale = 1.f;
      switch (a.mode) {
        case Fp8ActivationMode::kNone:
          std::copy(row + start, row + end, xq + t * cols + start);
          xs[t * groups + g] = 1.f;
          continue;
        case Fp8ActivationMode::kStatic:
          scale = a.static_scale;
          break;
        case Fp8ActivationMode::kDynamicGroup:
        case Fp8ActivationMode::kDynamicToken: {
          float amax = 0;
          for (int64_t i = start; i < end; ++i) amax = std::max(amax, std::abs(row[i]));
          scale = std::max(amax, kAmaxFloor) / kE4m3Max;
          break;
        }
      }
      for (int64_t i = start; i < end; ++i) xq[t * cols + i] = QuantizeOne(row[i], scale);
      xs[t * groups + g] = scale;
    }
  }
}

absl::Status ValidateFp8Gemm(const Fp8WeightMatrix& w, const Fp8Activation& a) {
  if (w.data == nullptr || w.scales == nullptr || w.rows < 1 || w.cols < 1 || w.scale_block < 1) {
    return absl::InvalidArgumentError("FP8 GEMM: empty weight, scales or block");
  }
  const int64_t group = ActivationGroup(a, w.cols);
  if (group < 1) return absl::InvalidArgumentError("FP8 GEMM: activation group must be >= 1");
  const int64_t lo = std::min(group, w.scale_block), hi = std::max(group, w.scale_block);
  if (hi < w.cols && hi % lo != 0) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 GEMM: activation group ", group,
                                                   " and weight scale block ", w.scale_block,
                                                   " do not nest"));
  }
  if (a.mode == Fp8ActivationMode::kStatic &&
      !(a.static_scale > 0 && std::isfinite(a.static_scale))) {
    return absl::InvalidArgumentError("FP8 GEMM: a static input scale must be finite and > 0");
  }
  return absl::OkStatus();
}

void Fp8Gemm(const CpuContext& ctx, const float* x, int64_t m, const Fp8WeightMatrix& w,
             const Fp8Activation& a, const float* bias, float* y, int64_t ldy) {
  const int64_t cols = w.cols, group = ActivationGroup(a, cols);
  const int64_t groups = (cols + group - 1) / group;
  const int64_t chunk = ChunkOf(w, a);
  std::vector<float> xq(static_cast<size_t>(m * cols)), xs(static_cast<size_t>(m * groups));
  QuantizeActivations(x, m, cols, a, xq.data(), xs.data());
  // Split over output rows; each decodes its weight row once for all tokens.
  auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> wrow(static_cast<size_t>(cols));
    for (int64_t o = begin; o < end; ++o) {
      DecodeRow(w, o, wrow.data());
      const float* ws = w.scales + o * w.scale_cols();
      for (int64_t t = 0; t < m; ++t) {
        const float v = Dot(xq.data() + t * cols, xs.data() + t * groups, wrow.data(), ws, cols,
                            chunk, group, w.scale_block);
        y[t * ldy + o] = bias ? v + bias[o] : v;
      }
    }
  };
  if (ctx.pool != nullptr) {
    ctx.pool->ParallelFor(w.rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, m)), rows);
  } else {
    rows(0, w.rows);
  }
}

namespace reference {

void Fp8Gemm(const float* x, int64_t m, const Fp8WeightMatrix& w, const Fp8Activation& a,
             const float* bias, float* y, int64_t ldy) {
  const int64_t cols = w.cols, group = ActivationGroup(a, cols);
  const int64_t groups = (cols + group - 1) / group;
  const int64_t chunk = ChunkOf(w, a);
  std::vector<float> xq(static_cast<size_t>(m * cols)), xs(static_cast<size_t>(m * groups));
  QuantizeActivations(x, m, cols, a, xq.data(), xs.data());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t o = 0; o < w.rows; ++o) {
      float acc = 0;
      for (int64_t start = 0; start < cols; start += chunk) {
        float partial = 0;
        for (int64_t i = start; i < std::min(cols, start + chunk); ++i) {
          partial += xq[t * cols + i] * E4m3ToFloat(w.data[o * cols + i]);
        }
        acc += partial * xs[t * groups + start / group] *
               w.scales[o * w.scale_cols() + start / w.scale_block];
      }
      y[t * ldy + o] = bias ? acc + bias[o] : acc;
    }
  }
}

}  // namespace reference
}  // namespace tessera::kernels::cpu
