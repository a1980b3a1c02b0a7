// Quantized checkpoints: the `quantization_config` of config.json for the
// two FP8 weight formats Tessera reads, and the strict checks of each FP8
// linear's tensors (weight, scales) against it. Nothing here computes; the
// arithmetic is in kernels/cpu/fp8_linear.h (reference) and
// kernels/cuda/fp8_*.h.
//
// Formats (weights e4m3fn, HF nn.Linear layout [out, in]; a weight value is
// e4m3 x scale):
//   Hugging Face fine-grained FP8 (DeepSeek-V3, Qwen3-*-FP8, GLM-4.5-FP8):
//     {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
//      "activation_scheme": "dynamic", "modules_to_not_convert": [...]}
//     <module>.weight            F8_E4M3 [out, in]
//     <module>.weight_scale_inv  F32 or BF16 [ceil(out/128), ceil(in/128)],
//                                MULTIPLIED in despite its name: block (i, j)
//                                of the weight is weight * scale_inv[i, j]
//     Activations are quantized on the fly per token and group of 128 input
//     features: scale = amax(|x_group|) / 448, xq = e4m3(x / scale).
//   compressed-tensors "float-quantized" (llm-compressor FP8, FP8-dynamic,
//   FP8-block):
//     {"quant_method": "compressed-tensors", "format": "float-quantized",
//      "config_groups": {"group_0": {"targets": ["Linear"],
//          "weights": {"num_bits": 8, "type": "float", "symmetric": true,
//                      "strategy": "tensor" | "channel" | "block",
//                      "block_structure": [128, 128], "dynamic": false},
//          "input_activations": null | {"num_bits": 8, "type": "float",
//                      "strategy": "token" | "tensor" | "group",
//                      "dynamic": true | false, "group_size": 128}}},
//      "ignore": ["lm_head", "re:.*mlp.gate$", ...]}
//     <module>.weight        F8_E4M3 [out, in]
//     <module>.weight_scale  F32/BF16/F16: [1] or [] (tensor), [out, 1]
//                            (channel), [ceil(out/128), ceil(in/128)] (block)
//     <module>.input_scale   [1] or [] when activations are static per tensor
//     Activations: dynamic per token (scale = amax(|x_row|) / 448), dynamic
//     per group of 128 (as fine-grained), static (xq = e4m3(clamp(x /
//     input_scale, +-448))), or none (weight-only FP8: x stays in fp32/bf16).
//
// Which modules are quantized: the decoder's linear projections (q, k, v, o,
// gate, up, down, and experts' / shared experts' ones) unless a
// modules_to_not_convert / ignore entry names them. Entries match as
// transformers and compressed-tensors match them: fine-grained entries match
// a module whose name contains them (`"lm_head"`, `"mlp.gate"` would also
// match `mlp.gate_proj`, so entries are compared per dotted component
// prefix, see IsQuantizedModule); compressed-tensors entries are exact
// module names or "re:<regex>" full matches. The embedding, norms, routers
// and lm_head are never FP8 in Tessera (an F8 tensor there is an error).
//
// Strict validation (errors name the tensor, INVALID_ARGUMENT unless noted):
//   - an unknown quant_method, a format other than float-quantized, e5m2,
//     non-8-bit or integer types, asymmetric or dynamic weights, several
//     config groups, targets other than Linear, a kv_cache_scheme, or block
//     sizes other than 128 x 128: UNIMPLEMENTED naming the key;
//   - a quantized module whose weight is not F8_E4M3, or an F8_E4M3 weight
//     of a module that is not quantized;
//   - a missing scale (NOT_FOUND, naming the scale and the weight);
//   - a scale with the wrong dtype (not F32/BF16/F16) or shape; when the
//     shape is that of another block size the message says so ("block size
//     64 x 64, but quantization_config declares 128 x 128");
//   - a scale that is NaN, infinite or negative (naming the index).
//
// Thread-safety: plain values; functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/tensor.h"

namespace tessera::model {

enum class QuantMethod {
  kFineGrainedFp8,        // quant_method "fp8"
  kCompressedTensorsFp8,  // quant_method "compressed-tensors", float-quantized
};

// How a weight's scales cover it.
enum class WeightScaleStrategy {
  kTensor,   // one scale
  kChannel,  // one per output row
  kBlock,    // one per block_out x block_in block
};

// How activations are quantized before the FP8 product.
enum class ActivationQuant {
  kNone,               // weight-only: activations stay high precision
  kDynamicTokenGroup,  // per token and group of `activation_group` features
  kDynamicToken,       // per token (whole row)
  kStaticTensor,       // one checkpoint scale per module (input_scale)
};

std::string_view QuantMethodName(QuantMethod m);
std::string_view WeightScaleStrategyName(WeightScaleStrategy s);
std::string_view ActivationQuantName(ActivationQuant a);

// The block size every FP8 block format uses and the kernels implement.
inline constexpr int64_t kFp8BlockSize = 128;

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kFineGrainedFp8;
  WeightScaleStrategy weight_strategy = WeightScaleStrategy::kBlock;
  int64_t block_out = kFp8BlockSize;  // kBlock
  int64_t block_in = kFp8BlockSize;   // kBlock
  ActivationQuant activation = ActivationQuant::kDynamicTokenGroup;
  int64_t activation_group = kFp8BlockSize;  // kDynamicTokenGroup
  // modules_to_not_convert (fine-grained) or ignore (compressed-tensors).
  std::vector<std::string> unquantized_modules;

  // "weight_scale_inv" (fine-grained) or "weight_scale".
  std::string_view weight_scale_suffix() const;
  // Whether the linear module `module` (e.g. "model.layers.0.mlp.up_proj")
  // holds an FP8 weight.
  bool IsQuantizedModule(std::string_view module) const;
  // One line for logs and `tessera doctor`, e.g. "fp8 (fine-grained): e4m3
  // weights, 128x128 block scales; activations dynamic per token group of 128".
  std::string Describe() const;
};

// Reads config.json's "quantization_config" (absent or null: nullopt).
// Messages name the key, prefixed "quantization_config.".
absl::StatusOr<std::optional<QuantizationConfig>> ParseQuantizationConfig(
    const nlohmann::json& config_json);

// The shape the weight scale of an [out, in] FP8 weight must have.
std::vector<int64_t> WeightScaleShape(const QuantizationConfig& q, int64_t out, int64_t in);

// Checks one FP8 linear of [out, in]: the weight's dtype, its weight scale
// (dtype, shape, finite values >= 0) and, for static activations, its input
// scale (shape [] or [1], finite > 0). `input_scale` may be null otherwise.
absl::Status CheckFp8Linear(const QuantizationConfig& q, std::string_view source,
                            const TensorView& weight, const TensorView& weight_scale,
                            const TensorView* input_scale);

}  // namespace tessera::model
