#include "kernels/op.h"

namespace tessera::kernels {

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kEmbedding:
      return "embedding";
    case Op::kRmsNorm:
      return "rmsnorm";
    case Op::kRope:
      return "rope";
    case Op::kGemm:
      return "gemm";
    case Op::kSiluMul:
      return "silu_mul";
    case Op::kKvCacheWrite:
      return "kv_cache_write";
    case Op::kAttentionPrefill:
      return "attention_prefill";
    case Op::kAttentionDecode:
      return "attention_decode";
    case Op::kLogitsProcessing:
      return "logits_processing";
    case Op::kSampling:
      return "sampling";
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kMoeRouting:
      return "moe_routing";
    case Op::kMoeExperts:
      return "moe_experts";
    case Op::kFp8Gemm:
      return "fp8_gemm";
  }
  return "unknown";
}

std::optional<Op> OpFromName(std::string_view name) {
  for (Op op : kAllOps) {
    if (OpName(op) == name) return op;
  }
  return std::nullopt;
}

}  // namespace tessera::kernels
