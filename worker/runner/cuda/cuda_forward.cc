#include "worker/runner/cuda/cuda_forward.h"

#include <cmath>

#include "base/status_macros.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gather_rows.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/silu_mul.h"
#include "worker/runner/cuda/cuda_moe_block.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;

const float* F32(const kcu::DeviceBuffer& b) { return b.size() == 0 ? nullptr : b.as<float>(); }

float Eps(const ForwardContext& c) { return static_cast<float>(c.config->rms_norm_eps); }

// q, k: RoPE (after Qwen3's per-head norms) in place, K/V into the cache,
// unless the qkv GEMV did it or decode attention will.
absl::Status RotateAndWriteKv(const ForwardContext& c, const StepPlan& plan,
                              const CudaLayerWeights& l, Bf16* k_cache, Bf16* v_cache) {
  if (plan.rope_in_qkv_gemv || plan.rope_in_attention) return absl::OkStatus();
  const int64_t D = c.config->head_dim, Q = c.heads * D, K = c.kv_heads * D, QKV = Q + 2 * K;
  Bf16* qkv = c.act->qkv.as<Bf16>();
  kcu::RopeKvWrite kv_write;
  kv_write.v = qkv + Q + K;
  kv_write.v_token_stride = QKV;
  kv_write.slots = c.batch->slots();
  kv_write.k_cache = k_cache;
  kv_write.v_cache = v_cache;
  kv_write.num_slots = c.kv->num_slots();
  return kcu::Rope(qkv, QKV, static_cast<int>(c.heads), qkv + Q, QKV, static_cast<int>(c.kv_heads),
                   static_cast<int>(D), c.batch->positions(), plan.tokens,
                   c.weights->inv_freq.as<float>(), F32(l.q_norm), F32(l.k_norm), Eps(c), c.stream,
                   &kv_write, c.weights->qkv_rope_order);
}

}  // namespace

absl::Status Embed(const ForwardContext& c, const StepPlan& plan) {
  const int64_t T = plan.tokens, H = c.config->hidden_size;
  const Bf16* table = c.weights->embed.as<Bf16>();
  float* residual = c.act->residual.as<float>();
  Bf16* xb = c.act->xb.as<Bf16>();
  const float* norm =
      c.weights->layers.empty() ? nullptr : c.weights->layers[0].input_norm.as<float>();
  if (plan.p2p_embedding) {
    // Each rank looks its vocabulary slice up in bf16 (other ids: zeros);
    // the fused all-reduce + RMSNorm sets the residual to the sum: exactly
    // one rank holds each id, so the residual gets the table's values.
    Bf16* delta = c.act->delta.as<Bf16>();
    RETURN_IF_ERROR(kcu::EmbeddingBf16(table, c.vocab, H, c.batch->tokens(), T, delta, c.stream));
    return c.reduce->SumNorm(delta, residual, T, H, norm, Eps(c), xb, c.stream);
  }
  RETURN_IF_ERROR(kcu::Embedding(table, c.vocab, H, c.batch->tokens(), T, residual, c.stream));
  RETURN_IF_ERROR(c.reduce->AllReduce(residual, T * H, kcu::NcclGroup::DType::kF32, c.stream));
  if (norm == nullptr) return absl::OkStatus();
  return kcu::RmsNorm(residual, T, H, norm, Eps(c), xb, c.stream);
}

absl::Status AttentionBlock(const ForwardContext& c, const StepPlan& plan, int64_t layer) {
  const CudaLayerWeights& l = c.weights->layers[layer];
  const int64_t T = plan.tokens, D = c.config->head_dim, H = c.config->hidden_size;
  const int64_t Q = c.heads * D, K = c.kv_heads * D, QKV = Q + 2 * K;
  Bf16* xb = c.act->xb.as<Bf16>();
  Bf16* qkv = c.act->qkv.as<Bf16>();
  Bf16* k_cache = c.kv->k(layer);
  Bf16* v_cache = c.kv->v(layer);
  if (plan.rope_in_qkv_gemv && l.qkv.is_fp8()) {
    return absl::InternalError("the qkv GEMV's RoPE epilogue reads bf16 weights, not FP8");
  }
  if (plan.rope_in_qkv_gemv) {
    kcu::GemvQkvRope rope;
    rope.head_dim = static_cast<int>(D);
    rope.q_rows = Q;
    rope.k_rows = K;
    rope.positions = c.batch->positions();
    rope.inv_freq = c.weights->inv_freq.as<float>();
    rope.slots = c.batch->slots();
    rope.num_slots = c.kv->num_slots();
    rope.k_cache = k_cache;
    rope.v_cache = v_cache;
    RETURN_IF_ERROR(c.gemm->QkvRope(xb, T, H, l.qkv.w(), l.qkv.b(), qkv, rope, c.stream));
  } else {
    RETURN_IF_ERROR(l.qkv.Apply(*c.gemm, xb, T, qkv, c.stream, CudaLinear::Input::kJustWritten));
  }
  RETURN_IF_ERROR(RotateAndWriteKv(c, plan, l, k_cache, v_cache));

  kcu::DecodeRope decode_rope;
  if (plan.rope_in_attention) {
    decode_rope.positions = c.batch->positions();
    decode_rope.inv_freq = c.weights->inv_freq.as<float>();
    decode_rope.rope_order = c.weights->qkv_rope_order;
    decode_rope.k = qkv + Q;
    decode_rope.v = qkv + Q + K;
    decode_rope.kv_token_stride = QKV;
    decode_rope.slots = c.batch->slots();
    decode_rope.num_slots = c.kv->num_slots();
    decode_rope.k_cache = k_cache;
    decode_rope.v_cache = v_cache;
    decode_rope.q_norm = F32(l.q_norm);
    decode_rope.k_norm = F32(l.k_norm);
    decode_rope.norm_eps = Eps(c);
  }
  kcu::PagedAttentionParams p;
  p.rope = plan.rope_in_attention ? &decode_rope : nullptr;
  p.q = qkv;
  p.q_token_stride = QKV;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = c.batch->block_tables();
  p.block_table_stride = c.batch->block_table_stride();
  p.seq_lens = c.batch->seq_lens();
  p.query_start_loc = c.batch->query_start_loc();
  p.num_seqs = plan.seqs;
  p.num_heads = static_cast<int>(c.heads);
  p.num_kv_heads = static_cast<int>(c.kv_heads);
  p.head_dim = static_cast<int>(D);
  p.block_size = c.block_size;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.max_seq_len = plan.max_seq_len;
  p.max_query_len = plan.max_query_len;
  p.out = c.act->attn.as<Bf16>();
  p.out_token_stride = Q;
  p.workspace = c.act->attn_workspace.data();
  p.workspace_bytes = c.act->attn_workspace.size();
  // Token trees: only the portable prefill kernel reads the masks
  // (PrefillAttentionSm90Supports is false with them); a decode step has
  // no branching chunk.
  const bool tree = plan.tree && !plan.decode;
  p.tree_ancestors = tree ? c.batch->tree_ancestors() : nullptr;
  p.tree_prefix = tree ? c.batch->tree_trunks() : nullptr;
  if (plan.decode) {
    RETURN_IF_ERROR(kcu::PagedAttentionDecode(p, c.stream));
  } else if (plan.prefill_sm90 && kcu::PrefillAttentionSm90Supports(p)) {
    RETURN_IF_ERROR(kcu::PrefillAttentionSm90(p, c.stream));
  } else {
    RETURN_IF_ERROR(kcu::PagedAttentionPrefill(p, c.stream));
  }
  return l.o.Apply(*c.gemm, c.act->attn.as<Bf16>(), T, c.act->delta.as<Bf16>(), c.stream,
                   CudaLinear::Input::kJustWritten);
}

absl::Status DenseMlp(const ForwardContext& c, const StepPlan& plan, const CudaLinear& gate_up,
                      const CudaLinear& down, int64_t width, bool silu_in_gemv, Bf16* out) {
  const int64_t T = plan.tokens, H = c.config->hidden_size;
  const Bf16* xb = c.act->xb.as<Bf16>();
  Bf16* act = c.act->act.as<Bf16>();
  if (silu_in_gemv && gate_up.is_fp8()) {
    return absl::InternalError("the staged gate/up GEMV reads bf16 weights, not FP8");
  }
  if (silu_in_gemv) {
    RETURN_IF_ERROR(
        kcu::GemvStagedGateUpSiluBf16(xb, T, H, gate_up.w(), width, gate_up.b(), act, c.stream));
  } else {
    Bf16* gu = c.act->gate_up.as<Bf16>();
    RETURN_IF_ERROR(gate_up.Apply(*c.gemm, xb, T, gu, c.stream, CudaLinear::Input::kJustWritten));
    RETURN_IF_ERROR(kcu::SiluMul(gu, T, width, act, c.stream, c.weights->gate_up_interleaved));
  }
  return down.Apply(*c.gemm, act, T, out, c.stream);
}

absl::Status MlpBlock(const ForwardContext& c, const StepPlan& plan, int64_t layer) {
  const CudaLayerWeights& l = c.weights->layers[layer];
  if (l.moe) return MoeBlock(c, plan, *l.moe, l.post_norm, static_cast<int>(layer));
  return DenseMlp(c, plan, l.gate_up, l.down, c.inter, plan.gate_up_silu_in_gemv,
                  c.act->delta.as<Bf16>());
}

absl::Status AddAndNorm(const ForwardContext& c, const StepPlan& plan,
                        const kcu::DeviceBuffer& norm) {
  return c.reduce->AddNorm(c.act->delta.as<Bf16>(), c.act->residual.as<float>(), plan.tokens,
                           c.config->hidden_size, norm.as<float>(), Eps(c), c.act->xb.as<Bf16>(),
                           c.stream);
}

absl::Status LmHead(const ForwardContext& c, const StepPlan& plan) {
  if (plan.logits_rows == 0) return absl::OkStatus();
  const int64_t H = c.config->hidden_size;
  RETURN_IF_ERROR(kcu::GatherRows(c.act->xb.as<Bf16>(), plan.tokens, H, c.batch->logits_indices(),
                                  plan.logits_rows, c.act->rows.as<Bf16>(), c.stream));
  return c.gemm->Gemm(c.act->rows.as<Bf16>(), plan.logits_rows, H, c.weights->lm_head(), c.vocab,
                      nullptr, c.act->logits.as<float>(), c.stream);
}

}  // namespace tessera::runner
