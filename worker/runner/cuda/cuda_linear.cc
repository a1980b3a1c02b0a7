#include "worker/runner/cuda/cuda_linear.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda_devices.h"
#include "kernels/cuda_fp8_backend.h"
#include "kernels/registry.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;
using kcu::DeviceBuffer;
using model::ActivationQuant;

absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, std::string_view what) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating the FP8 workspace's ",
                                                     std::string(what), " (", bytes >> 20,
                                                     " MiB) on the GPU: ", b.status().message()));
  }
  return b;
}

int64_t Groups(int64_t in) { return (in + kcu::kFp8Block - 1) / kcu::kFp8Block; }

// A block slice [start, start + len) of `total` that starts or ends inside
// a 128-block (the end may be the tensor's).
bool CutsBlock(parallel::Range r, int64_t total) {
  return r.start % kcu::kFp8Block != 0 || (r.size % kcu::kFp8Block != 0 && r.end() != total);
}

absl::Status CheckSlice(std::string_view what, std::string_view axis, parallel::Range r,
                        int64_t total, const parallel::ShardPlan& plan) {
  if (!CutsBlock(r, total)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor-parallel rank ", plan.rank, " would hold ", std::string(axis), " [", r.start, ", ",
      r.end(), ") of ", total, " of the FP8 ", std::string(what),
      ", which cuts a 128 x 128 weight-scale block; the CUDA runner slices block-scaled FP8 "
      "weights only at multiples of 128 (choose a tensor-parallel size that divides them so)"));
}

}  // namespace

std::string_view CudaFp8PrefillName(CudaFp8Prefill p) {
  return p == CudaFp8Prefill::kCublasLtBlock ? kernels::kCublasLtFp8BlockBackend
                                             : kernels::kCudaFp8DequantBackend;
}

kcu::Fp8DeviceWeight CudaFp8Part::device_weight() const {
  return {weight.as<uint8_t>(), rows, in, scales.as<float>(), row_block, block};
}

kcu::Fp8ActivationQuant CudaFp8Part::quant() const {
  kcu::Fp8ActivationQuant q;
  q.group = activation == ActivationQuant::kDynamicTokenGroup ? kcu::kFp8Block : in;
  q.static_scale = activation == ActivationQuant::kStaticTensor ? input_scale.as<float>() : nullptr;
  return q;
}

bool CudaFp8Part::QuantizesLike(const CudaFp8Part& other) const {
  return activation == other.activation && in == other.in &&
         (activation != ActivationQuant::kStaticTensor ||
          input_scale_value == other.input_scale_value);
}

absl::StatusOr<std::unique_ptr<CudaFp8Workspace>> CudaFp8Workspace::Create(const Needs& needs) {
  std::unique_ptr<CudaFp8Workspace> ws(new CudaFp8Workspace());
  ws->needs_ = needs;
  if (needs.max_dequant_elems > 0) {
    ASSIGN_OR_RETURN(ws->weight_bf16_,
                     Allocate(needs.max_dequant_elems * sizeof(Bf16), "dequantized weight"));
  }
  ASSIGN_OR_RETURN(ws->xs_tail_, Allocate(kcu::kFp8GemvMaxRows * Groups(needs.max_in) * 4 + 256,
                                          "activation scales"));
  if (needs.cublaslt) {
    ASSIGN_OR_RETURN(ws->lt_, kcu::Fp8BlockGemm::Create());
  }
  RETURN_IF_ERROR(ws->Reserve(kFp8WorkspaceTokens));
  return ws;
}

CudaFp8Workspace::~CudaFp8Workspace() = default;

absl::Status CudaFp8Workspace::Reserve(int64_t tokens) {
  if (tokens <= tokens_) return absl::OkStatus();
  const int64_t t = std::max(tokens, 2 * tokens_);
  const int64_t in = std::max<int64_t>(needs_.max_in, 16);
  // Graphs captured with the old buffers may still be launched.
  for (DeviceBuffer* b : {&xq_, &xs_, &qdq_, &part_out_}) {
    if (b->size() != 0) retired_.push_back(std::move(*b));
  }
  ASSIGN_OR_RETURN(xq_, Allocate(t * in, "quantized activations"));
  ASSIGN_OR_RETURN(xs_, Allocate(t * Groups(in) * sizeof(float), "activation scales"));
  if (needs_.qdq) {
    ASSIGN_OR_RETURN(qdq_, Allocate(t * in * sizeof(Bf16), "e4m3-rounded activations"));
  }
  if (needs_.parts_out) {
    ASSIGN_OR_RETURN(part_out_, Allocate(t * needs_.max_part_rows * sizeof(Bf16), "part output"));
  }
  tokens_ = t;
  return absl::OkStatus();
}

absl::Status CudaLinear::Apply(kcu::GemmContext& gemm, const Bf16* x, int64_t rows, Bf16* y,
                               kcu::CudaStream stream, Input input) const {
  if (is_fp8()) return ApplyFp8(gemm, x, rows, y, stream);
  if (input == Input::kJustWritten) return gemm.GemmChained(x, rows, in, w(), out, b(), y, stream);
  return gemm.Gemm(x, rows, in, w(), out, b(), y, stream);
}

namespace {

// What one part's product needs besides the part.
struct PartCall {
  kcu::GemmContext* gemm;
  CudaFp8Workspace* ws;
  const Bf16* x;
  int64_t tokens;
  const float* bias;  // the part's rows; null = none
  Bf16* y;            // the part's first column of the linear's output
  int64_t ldy;        // the linear's out
  bool alone;         // the linear's only part (y has ld == part rows)
  kcu::CudaStream stream;
};

// The part's rows of the output through a bf16 GEMM: `dst` [tokens, rows]
// contiguous, copied into the linear's output unless the part is alone.
absl::Status FinishPartOutput(const PartCall& c, const CudaFp8Part& p) {
  if (c.alone) return absl::OkStatus();
  return kcu::Fp8CopyPartOutput(c.ws->part_out(), c.tokens, p.rows, c.y, c.ldy, c.stream);
}

// kDequantize, and weight-only FP8: bf16(e4m3 x scale) weights, x rounded
// through e4m3 (unless weight-only), the bf16 GEMM.
absl::Status DequantizedProduct(const PartCall& c, const CudaFp8Part& p) {
  RETURN_IF_ERROR(kcu::Fp8DequantizeWeightBf16(p.device_weight(), c.ws->weight_bf16(), c.stream));
  const Bf16* x = c.x;
  if (p.activation != ActivationQuant::kNone) {
    RETURN_IF_ERROR(
        kcu::Fp8QuantizeDequantizeBf16(c.x, c.tokens, p.in, p.quant(), c.ws->qdq(), c.stream));
    x = c.ws->qdq();
  }
  Bf16* dst = c.alone ? c.y : c.ws->part_out();
  RETURN_IF_ERROR(
      c.gemm->Gemm(x, c.tokens, p.in, c.ws->weight_bf16(), p.rows, c.bias, dst, c.stream));
  return FinishPartOutput(c, p);
}

// Rows [first, first + n) of x quantized row-major into the workspace, then
// the FP8 GEMV into `dst` rows (ld `ld`).
absl::Status GemvRows(const PartCall& c, const CudaFp8Part& p, int64_t first, int64_t n,
                      const float* bias, Bf16* dst, int64_t ld, float* xs) {
  const kcu::Fp8ActivationQuant q = p.quant();
  uint8_t* xq = c.ws->xq() + first * p.in;
  RETURN_IF_ERROR(kcu::Fp8QuantizeActivations(c.x + first * p.in, n, p.in, q, xq, xs, c.stream));
  return kcu::Fp8GemvBf16(xq, xs, n, q.group, p.device_weight(), bias, dst + first * ld, ld,
                          c.stream);
}

// kCublasLtBlock: the rows in multiples of 16 through cuBLASLt's
// block-scaled GEMM, the rest (< 16) through the GEMV.
absl::Status CublasLtProduct(const PartCall& c, const CudaFp8Part& p) {
  const int64_t m16 = c.tokens / 16 * 16;
  Bf16* dst = c.alone ? c.y : c.ws->part_out();
  const int64_t ld = p.rows;  // alone: the linear's out
  if (m16 > 0) {
    RETURN_IF_ERROR(
        kcu::Fp8QuantizeActivations(c.x, m16, p.in, p.quant(), c.ws->xq(), c.ws->xs(), c.stream));
    RETURN_IF_ERROR(c.ws->lt()->Run(c.ws->xq(), c.ws->xs(), m16, p.weight.as<uint8_t>(),
                                    p.scales.as<float>(), p.rows, p.in, dst, c.stream));
  }
  for (int64_t t = m16; t < c.tokens; t += kcu::kFp8GemvMaxRows) {
    const int64_t n = std::min<int64_t>(kcu::kFp8GemvMaxRows, c.tokens - t);
    RETURN_IF_ERROR(GemvRows(c, p, t, n, nullptr, dst, ld, c.ws->xs_tail()));
  }
  return FinishPartOutput(c, p);
}

}  // namespace

absl::Status CudaLinear::ApplyFp8(kcu::GemmContext& gemm, const Bf16* x, int64_t rows, Bf16* y,
                                  kcu::CudaStream stream) const {
  if (fp8_workspace == nullptr) {
    return absl::FailedPreconditionError(
        "an FP8 linear without its workspace (UploadWeights sets it)");
  }
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(fp8_workspace->Reserve(rows));
  const CudaFp8Part* quantized = nullptr;  // whose quantization of x the workspace holds
  for (const CudaFp8Part& p : fp8) {
    PartCall c{&gemm,
               fp8_workspace,
               x,
               rows,
               b() == nullptr ? nullptr : b() + p.first_row,
               y + p.first_row,
               out,
               fp8.size() == 1,
               stream};
    if (p.activation == ActivationQuant::kNone) {
      RETURN_IF_ERROR(DequantizedProduct(c, p));
      continue;
    }
    const kcu::Fp8ActivationQuant q = p.quant();
    if (rows <= kcu::kFp8GemvMaxRows &&
        kcu::Fp8GemvApplicable(rows, p.in, fp8_workspace->xq(), p.device_weight(), q.group)) {
      if (quantized != nullptr && quantized->QuantizesLike(p)) {
        RETURN_IF_ERROR(kcu::Fp8GemvBf16(fp8_workspace->xq(), fp8_workspace->xs(), rows, q.group,
                                         p.device_weight(), c.bias, c.y, out, stream));
      } else {
        RETURN_IF_ERROR(GemvRows(c, p, 0, rows, c.bias, c.y, out, fp8_workspace->xs()));
        quantized = &p;
      }
      continue;
    }
    quantized = nullptr;
    RETURN_IF_ERROR(p.prefill == CudaFp8Prefill::kCublasLtBlock ? CublasLtProduct(c, p)
                                                                : DequantizedProduct(c, p));
  }
  return absl::OkStatus();
}

absl::Status CheckCudaFp8Support(const model::ModelConfig& config,
                                 const parallel::ShardPlan& plan) {
  if (!config.quantization) return absl::OkStatus();
  const model::QuantizationConfig& q = *config.quantization;
  const std::string format = q.Describe();
  if (config.moe) {
    return absl::UnimplementedError(absl::StrCat(
        "FP8 mixture-of-experts checkpoints (", format,
        ") do not run on the CUDA runner yet: FP8 experts are issue #34 part 3 (docs/fp8.md)"));
  }
  if (config.rotary_dim() != config.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        "FP8 checkpoints with partial RoPE (rotary dim ", config.rotary_dim(), " of head_dim ",
        config.head_dim,
        ") do not run on the CUDA runner: its q/k row permutation would cut the 128-row weight "
        "scale blocks; use --device=cpu"));
  }
  if (q.activation == ActivationQuant::kDynamicTokenGroup && q.activation_group != kcu::kFp8Block) {
    return absl::UnimplementedError(absl::StrCat(
        "FP8 activation groups of ", q.activation_group,
        " features: the CUDA FP8 kernels quantize activations per group of 128, per token or "
        "with a static scale"));
  }
  if (q.weight_strategy != model::WeightScaleStrategy::kBlock) return absl::OkStatus();
  const int64_t D = config.head_dim;
  const parallel::Range q_rows{plan.q_heads.start * D, plan.q_heads.size * D};
  const parallel::Range kv_rows{plan.kv_heads.start * D, plan.kv_heads.size * D};
  const int64_t Q = config.num_attention_heads * D, K = config.num_key_value_heads * D;
  RETURN_IF_ERROR(CheckSlice("q_proj", "rows", q_rows, Q, plan));
  RETURN_IF_ERROR(CheckSlice("k_proj/v_proj", "rows", kv_rows, K, plan));
  RETURN_IF_ERROR(CheckSlice("o_proj", "columns", q_rows, Q, plan));
  RETURN_IF_ERROR(
      CheckSlice("gate_proj/up_proj", "rows", plan.intermediate, config.intermediate_size, plan));
  return CheckSlice("down_proj", "columns", plan.intermediate, config.intermediate_size, plan);
}

absl::StatusOr<CudaFp8Prefill> SelectCudaFp8Prefill(const kernels::DeviceDescription* device,
                                                    std::string_view override_name) {
  std::vector<kernels::DeviceDescription> devices;
  if (device != nullptr) {
    devices.push_back(*device);
  } else {
    devices = kernels::DetectCudaDevices().devices;
  }
  CudaFp8Prefill chosen = CudaFp8Prefill::kCublasLtBlock;
  if (devices.empty()) chosen = CudaFp8Prefill::kDequantize;
  for (const kernels::DeviceDescription& d : devices) {
    absl::StatusOr<kernels::Selection> s = kernels::BuiltinRegistry().Select(
        kernels::Op::kFp8Gemm, d, override_name, "fp8_gemm_backend");
    if (!s.ok()) return s.status();
    if (s->chosen == kernels::kCudaFp8DequantBackend) {
      chosen = CudaFp8Prefill::kDequantize;
    } else if (s->chosen != kernels::kCublasLtFp8BlockBackend) {
      return absl::InvalidArgumentError(
          absl::StrCat("FP8 linear backend '", s->chosen, "' on ", d.Summary(),
                       " is not a CUDA one (the CUDA runner runs ",
                       std::string(kernels::kCublasLtFp8BlockBackend), " or ",
                       std::string(kernels::kCudaFp8DequantBackend), ")"));
    }
  }
  return chosen;
}

}  // namespace tessera::runner
