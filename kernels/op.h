// The operations a forward pass runs, as the kernel registry names them.
// Every op is chosen through the registry (kernels/registry.h), sampling and
// collectives included, so that no path bypasses selection and preflight.
//
// Thread-safety: pure functions over constants.
#pragma once

#include <optional>
#include <string_view>

namespace tessera::kernels {

enum class Op {
  kEmbedding,         // token ids -> fp32 rows of the embedding table
  kRmsNorm,           // RMSNorm, plain and with fused residual add
  kRope,              // rotary position embedding on q and k
  kGemm,              // x . W^T (+ bias): projections, MLP, LM head
  kSiluMul,           // silu(gate) * up
  kKvCacheWrite,      // new K/V rows into the paged cache
  kAttentionPrefill,  // paged causal attention, q_len >= 1 per sequence
  kAttentionDecode,   // paged attention, exactly one query token per sequence
  kLogitsProcessing,  // softmax / log-softmax over logits rows
  kSampling,          // token choice (argmax; random draws build on softmax)
  kAllReduce,         // tensor-parallel sum across ranks
  kMoeRouting,        // router logits -> each token's top-k experts and weights
  kMoeExperts,        // the routed experts' SwiGLU MLPs, combined weighted in fp32
  kFp8Gemm,           // x . W^T for FP8 (e4m3 + scales) weights, activations quantized on the fly
};

// Every op, in the order reports list them.
inline constexpr Op kAllOps[] = {
    Op::kEmbedding,
    Op::kRmsNorm,
    Op::kRope,
    Op::kGemm,
    Op::kSiluMul,
    Op::kKvCacheWrite,
    Op::kAttentionPrefill,
    Op::kAttentionDecode,
    Op::kLogitsProcessing,
    Op::kSampling,
    Op::kAllReduce,
    Op::kMoeRouting,
    Op::kMoeExperts,
    Op::kFp8Gemm,
};

// "embedding", "rmsnorm", "rope", "gemm", "silu_mul", "kv_cache_write",
// "attention_prefill", "attention_decode", "logits_processing", "sampling",
// "all_reduce", "moe_routing", "moe_experts", "fp8_gemm".
std::string_view OpName(Op op);
std::optional<Op> OpFromName(std::string_view name);

}  // namespace tessera::kernels
