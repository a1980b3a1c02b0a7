#include "tests/bench/random_cuda_weights.h"

#include <string_view>

#include "base/status_macros.h"
#include "kernels/cuda/random_fill.h"

namespace tessera::bench {

namespace kcu = ::tessera::kernels::cuda;

runner::CudaWeightsFactory RandomCudaWeights(uint64_t seed) {
  return [seed](const model::ModelConfig& c,
                const parallel::ShardPlan& plan) -> absl::StatusOr<runner::CudaWeights> {
    runner::CudaWeights w;
    uint64_t stream_id = seed + 7919 * static_cast<uint64_t>(plan.rank);
    auto random = [&](int64_t elems, kcu::DeviceBuffer* out,
                      std::string_view what) -> absl::Status {
      absl::StatusOr<kcu::DeviceBuffer> buf =
          runner::AllocateDevice(elems * sizeof(kcu::Bf16), what);
      if (!buf.ok()) return buf.status();
      RETURN_IF_ERROR(
          kcu::FillRandomBf16(buf->as<kcu::Bf16>(), elems, ++stream_id, 0.03f, nullptr));
      w.bytes += elems * static_cast<int64_t>(sizeof(kcu::Bf16));
      *out = std::move(*buf);
      return absl::OkStatus();
    };
    auto ones = [&](int64_t elems, kcu::DeviceBuffer* out) -> absl::Status {
      absl::StatusOr<kcu::DeviceBuffer> buf = runner::AllocateDevice(elems * sizeof(float), "norm");
      if (!buf.ok()) return buf.status();
      RETURN_IF_ERROR(kcu::FillConstantF32(buf->as<float>(), elems, 1.0f, nullptr));
      *out = std::move(*buf);
      return absl::OkStatus();
    };
    auto linear = [&](int64_t out, int64_t in, runner::CudaLinear* l, std::string_view what) {
      l->out = out;
      l->in = in;
      return random(out * in, &l->weight, what);
    };
    const int64_t H = c.hidden_size, D = c.head_dim, V = plan.vocab.size;
    const int64_t Q = plan.q_heads.size * D, K = plan.kv_heads.size * D, I = plan.intermediate.size;
    RETURN_IF_ERROR(random(V * H, &w.embed, "embed_tokens"));
    if (!c.tie_word_embeddings) RETURN_IF_ERROR(random(V * H, &w.lm_head_own, "lm_head"));
    RETURN_IF_ERROR(ones(H, &w.final_norm));
    absl::StatusOr<kcu::DeviceBuffer> freq = runner::UploadRopeFrequencies(c);
    if (!freq.ok()) return freq.status();
    w.inv_freq = std::move(*freq);
    w.qkv_rope_order = runner::UsesQkvRopeOrder(c);  // random rows: any order
    w.gate_up_interleaved = runner::UsesGateUpInterleaved(plan);
    w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      runner::CudaLayerWeights& l = w.layers[i];
      RETURN_IF_ERROR(linear(Q + 2 * K, H, &l.qkv, "qkv"));
      RETURN_IF_ERROR(linear(H, Q, &l.o, "o_proj"));
      if (c.IsSparseLayer(i)) {
        l.moe.emplace();
        runner::CudaMoeWeights& m = *l.moe;
        ASSIGN_OR_RETURN(m.routing, runner::MoeRoutingFor(*c.moe));
        const int64_t E = c.moe->num_experts, held = plan.experts.size;
        const int64_t J = plan.expert_intermediate.size, S = plan.shared_intermediate.size;
        RETURN_IF_ERROR(linear(E, H, &m.router, "router"));
        if (c.moe->has_correction_bias()) {
          RETURN_IF_ERROR(ones(E, &m.correction_bias));
          m.routing.correction_bias = m.correction_bias.as<float>();
        }
        RETURN_IF_ERROR(random(held * 2 * J * H, &m.gate_up, "experts gate_up"));
        RETURN_IF_ERROR(random(held * H * J, &m.down, "experts down"));
        m.num_experts = static_cast<int>(held);
        m.first_expert = static_cast<int32_t>(plan.experts.start);
        m.inter = J;
        if (S > 0) {
          RETURN_IF_ERROR(linear(2 * S, H, &m.shared_gate_up, "shared gate_up"));
          RETURN_IF_ERROR(linear(H, S, &m.shared_down, "shared down"));
          m.shared_inter = S;
        }
      } else {
        RETURN_IF_ERROR(linear(2 * I, H, &l.gate_up, "gate_up"));
        RETURN_IF_ERROR(linear(H, I, &l.down, "down_proj"));
      }
      RETURN_IF_ERROR(ones(H, &l.input_norm));
      RETURN_IF_ERROR(ones(H, &l.post_norm));
      if (c.qk_norm) {
        RETURN_IF_ERROR(ones(D, &l.q_norm));
        RETURN_IF_ERROR(ones(D, &l.k_norm));
      }
    }
    RETURN_IF_ERROR(kcu::SynchronizeDevice());
    return w;
  };
}

}  // namespace tessera::bench
