// CpuLinear: one linear layer y = x . W^T (+ b) on the CPU kernels, the seam
// where weight formats plug in. A layer module calls Apply and does not know
// how the product is computed:
//   dense  a bf16/fp16/fp32 matrix (q/k/v and gate/up stacked into one), run
//          by the registry's kGemm entry;
//   FP8    e4m3 parts (worker/model/quantization.h), run by kFp8Gemm
//          (kernels/cpu/fp8_linear.h): one part per checkpoint tensor, each
//          writing its rows of the output and quantizing x with its own
//          activation scheme (static input_scales differ between q, k and
//          v). Weights are read in place from the memory map; the scales are
//          expanded to one row per weight row, owned by the loader.
//
// Thread-safety: Apply is const and reentrant; kernels use the context's pool.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu_backend.h"
#include "worker/model/quantization.h"
#include "worker/model/weights.h"
#include "worker/runner/cpu_weight_loader.h"

namespace tessera::runner {

struct CpuLinear {
  struct Fp8Part {
    kernels::cpu::Fp8WeightMatrix weight;
    kernels::cpu::Fp8Activation activation;
    int64_t first_row = 0;  // of the output
  };
  kernels::cpu::WeightMatrix dense;  // when fp8 is empty
  std::vector<Fp8Part> fp8;
  int64_t rows = 0, cols = 0;

  bool is_fp8() const { return !fp8.empty(); }

  // y[n, rows] = x[n, cols] . W^T (+ bias[rows]). REQUIRES: y does not overlap x.
  void Apply(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
             int64_t n, const float* bias, float* y) const;

  // The rows of `parts` stacked into one linear: dense (loader->Fuse) when
  // no part is FP8, FP8 parts when all are (`layer` holds their scales,
  // `quant` the scheme). A mix is UNIMPLEMENTED naming the tensors.
  static absl::StatusOr<CpuLinear> Prepare(std::initializer_list<const model::TensorView*> parts,
                                           const model::LayerWeights& layer,
                                           const std::optional<model::QuantizationConfig>& quant,
                                           CpuWeightLoader* loader);
};

}  // namespace tessera::runner
