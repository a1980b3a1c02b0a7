// CudaLinear: one linear layer y = x · Wᵀ (+ b) on the GPU, the seam where
// weight formats plug in: a layer module calls Apply and does not know how
// the product is computed.
//   bf16  weights [out, in], fp32 accumulation, fp32 bias (GemmContext).
//   FP8   e4m3 parts (worker/model/quantization.h): one part per group of
//         checkpoint tensors whose scales stack (q/k/v or gate/up merge
//         into one part when their rows fill whole 128-blocks and they
//         quantize x alike), each writing its rows of the output. Per call:
//           steps of <= 8 tokens: x quantized as the part's format says
//             (dynamic per token group of 128, per token, or the static
//             input_scale; kernels/cuda/fp8_gemv.h), then the FP8 GEMV;
//           longer steps (prefill, large decode batches):
//             kCublasLtBlock  x quantized per token group of 128, then
//               cuBLASLt's block-scaled FP8 GEMM (kernels/cuda/fp8_gemm.h;
//               Hopper), the last < 16 rows through the GEMV;
//             kDequantize  the weight dequantized to bf16 into the
//               workspace, x rounded through e4m3 as the format says
//               (Fp8QuantizeDequantizeBf16), the bf16 GEMM.
//           weight-only FP8 (no activation quantization) dequantizes the
//           weight on every call, decode too: no kernel multiplies bf16
//           activations with e4m3 weights yet.
//         The arithmetic is kernels/cpu/fp8_linear.h's (the reference).
//         Nothing synchronizes or allocates in a call that fits the
//         workspace, so FP8 decode steps capture into CUDA graphs.
// The fused epilogues of bf16 GEMVs (RoPE/KV in the qkv GEMV, the staged
// GEMV, SiLU·mul in the gate/up GEMV) read bf16 weights; FP8 models switch
// them off (cuda_weights.h, CudaWeights::fp8_plan says so).
//
// Thread-safety: const; the GemmContext, the FP8 workspace and the stream
// belong to the rank's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8_gemv.h"
#include "kernels/device.h"
#include "worker/model/config.h"
#include "worker/model/quantization.h"
#include "worker/parallel/shard_plan.h"

namespace tessera::kernels::cuda {
class GemmContext;
class Fp8BlockGemm;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

// How an FP8 part runs steps the GEMV does not take.
enum class CudaFp8Prefill { kDequantize, kCublasLtBlock };
std::string_view CudaFp8PrefillName(CudaFp8Prefill p);

// One FP8 part of a linear (see above).
struct CudaFp8Part {
  kernels::cuda::DeviceBuffer weight;       // e4m3 [rows, in]
  kernels::cuda::DeviceBuffer scales;       // fp32 [ceil(rows / row_block), ceil(in / block)]
  kernels::cuda::DeviceBuffer input_scale;  // fp32 [1]: static activations; empty otherwise
  float input_scale_value = 0.f;            // its value (parts that share x's quantization)
  int64_t first_row = 0, rows = 0, in = 0;
  int64_t row_block = kernels::cuda::kFp8Block;  // rows one scale row covers
  int64_t block = kernels::cuda::kFp8Block;      // features one scale covers (128 or in)
  model::ActivationQuant activation = model::ActivationQuant::kDynamicTokenGroup;
  CudaFp8Prefill prefill = CudaFp8Prefill::kDequantize;

  kernels::cuda::Fp8DeviceWeight device_weight() const;
  // The activation quantizer's settings (kNone: not quantized).
  kernels::cuda::Fp8ActivationQuant quant() const;
  bool QuantizesLike(const CudaFp8Part& other) const;
};

// Scratch of a rank's FP8 linears: quantized activations, their scales,
// dequantized weights and activations, a part's output, cuBLASLt's FP8
// GEMM. Sized at upload for the largest linear and kFp8WorkspaceTokens
// rows; a longer (eager) step grows the token-sized buffers, keeping the
// old ones alive for graphs captured with them.
class CudaFp8Workspace {
 public:
  static constexpr int64_t kFp8WorkspaceTokens = 1024;

  struct Needs {
    int64_t max_in = 0, max_out = 0, max_part_rows = 0;
    int64_t max_dequant_elems = 0;  // largest weight a kDequantize/kNone part expands
    bool qdq = false;               // a kDequantize part quantizes x
    bool parts_out = false;         // a linear of several parts
    bool cublaslt = false;          // a kCublasLtBlock part
  };
  static absl::StatusOr<std::unique_ptr<CudaFp8Workspace>> Create(const Needs& needs);
  ~CudaFp8Workspace();

  // REQUIRES: called before a step's first FP8 linear (never inside a
  // graph capture with more tokens than the workspace holds).
  absl::Status Reserve(int64_t tokens);

  uint8_t* xq() const { return xq_.as<uint8_t>(); }
  float* xs() const { return xs_.as<float>(); }
  float* xs_tail() const { return xs_tail_.as<float>(); }
  kernels::cuda::Bf16* qdq() const { return qdq_.as<kernels::cuda::Bf16>(); }
  kernels::cuda::Bf16* part_out() const { return part_out_.as<kernels::cuda::Bf16>(); }
  kernels::cuda::Bf16* weight_bf16() const { return weight_bf16_.as<kernels::cuda::Bf16>(); }
  kernels::cuda::Fp8BlockGemm* lt() const { return lt_.get(); }

 private:
  CudaFp8Workspace() = default;
  Needs needs_;
  int64_t tokens_ = 0;
  kernels::cuda::DeviceBuffer xq_, xs_, xs_tail_, qdq_, part_out_, weight_bf16_;
  std::vector<kernels::cuda::DeviceBuffer> retired_;
  std::unique_ptr<kernels::cuda::Fp8BlockGemm> lt_;
};

struct CudaLinear {
  kernels::cuda::DeviceBuffer weight;  // bf16 [out, in] (empty for FP8)
  kernels::cuda::DeviceBuffer bias;    // fp32 [out]; empty = none
  int64_t out = 0, in = 0;
  std::vector<CudaFp8Part> fp8;               // FP8 parts, rows in order; empty = bf16
  CudaFp8Workspace* fp8_workspace = nullptr;  // CudaWeights::fp8_workspace

  bool is_fp8() const { return !fp8.empty(); }
  const kernels::cuda::Bf16* w() const { return weight.as<kernels::cuda::Bf16>(); }
  const float* b() const { return bias.size() == 0 ? nullptr : bias.as<float>(); }

  // Where x comes from: written by the kernel just before on the stream
  // (the staged GEMV may then overlap its weight reads with that kernel,
  // kernels/cuda/gemm.h GemmChained), or anything else.
  enum class Input { kJustWritten, kAny };
  // y[rows, out] = x[rows, in] · Wᵀ (+ b).
  absl::Status Apply(kernels::cuda::GemmContext& gemm, const kernels::cuda::Bf16* x, int64_t rows,
                     kernels::cuda::Bf16* y, kernels::cuda::CudaStream stream,
                     Input input = Input::kAny) const;

 private:
  absl::Status ApplyFp8(kernels::cuda::GemmContext& gemm, const kernels::cuda::Bf16* x,
                        int64_t rows, kernels::cuda::Bf16* y,
                        kernels::cuda::CudaStream stream) const;
};

// What the CUDA runner cannot run of an FP8 checkpoint, before any device
// call: mixture-of-experts layers (FP8 experts are part 3 of issue #34),
// partial RoPE (its row permutation would cut the scale blocks), activation
// groups other than 128, and tensor-parallel slices that cut a 128-row or
// 128-column scale block (`plan`'s q/KV heads, intermediate rows). OK for
// configs without quantization.
absl::Status CheckCudaFp8Support(const model::ModelConfig& config, const parallel::ShardPlan& plan);

// The FP8 prefill the registry (Op::kFp8Gemm, kernels/cuda_fp8_backend.h)
// chooses on `device`, or on every visible GPU when `device` is null (the
// slower one when they differ). `override_name` "auto" or a backend name.
absl::StatusOr<CudaFp8Prefill> SelectCudaFp8Prefill(const kernels::DeviceDescription* device,
                                                    std::string_view override_name = "auto");

}  // namespace tessera::runner
