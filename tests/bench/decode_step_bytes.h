// DecodeStepBytes: what one decode step of a model must read from memory,
// part by part — the roofline's denominator for every decode benchmark
// (gpu_decode_bench dense and MoE, and any benchmark that reports a
// fraction of a bandwidth roofline). A step reads:
//   - every decoder layer's matrices (MoE: attention, routers, the experts
//     the step's tokens select, dense and shared MLPs) and norms,
//   - the LM head (the embedding table once more when tied),
//   - one embedding row per token — not the whole table,
//   - the KV cache its attention reads (K and V of every cached position).
// Matrices at `weight_bytes_per_element` (2 for bf16, 1 for FP8 — a
// quantised benchmark adds its scales as `extra_bytes` and keeps the LM
// head and embedding at `head_bytes_per_element`), norms and MoE
// correction biases in fp32 and the KV cache at `kv_bytes_per_element`, as
// the CUDA runner holds them. Selected experts per MoE layer: the
// expectation under uniform routing, E (1 - (1 - k/E)^B) for B tokens.
//
// tests/bench/recompute_roofline.py applies the same count to result files
// written before it existed (its test pins the two to each other).
//
// Header-only (every benchmark includes it, none links more for it).
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "nlohmann/json.hpp"
#include "worker/model/config.h"

namespace tessera::bench {

struct StepBytesOptions {
  double weight_bytes_per_element = 2.0;
  double kv_bytes_per_element = 2.0;
  double extra_bytes = 0;  // read every step besides the above (quantisation scales, ...)
  // The LM head and embedding rows (0: weight_bytes_per_element); FP8
  // checkpoints keep them in bf16 (2).
  double head_bytes_per_element = 0;
};

struct StepBytes {
  double attention_weights = 0;
  double routers = 0;
  double selected_experts = 0;
  double selected_experts_per_layer = 0;  // MoE: expected distinct experts per layer
  double dense_and_shared_mlp = 0;
  double norms = 0;
  double lm_head = 0;
  double embedding_rows = 0;
  double kv_cache = 0;
  double extra = 0;

  double total() const {
    return attention_weights + routers + selected_experts + dense_and_shared_mlp + norms + lm_head +
           embedding_rows + kv_cache + extra;
  }
  // The parts and the total, as result files carry them ("step_bytes").
  nlohmann::json ToJson() const;
};

// Expected distinct experts `tokens` tokens select in one layer, each
// choosing k of E uniformly: E (1 - (1 - k/E)^tokens).
double ExpectedDistinctExperts(const model::MoeConfig& moe, int tokens);

// One decode step of `batch` sequences (one token each) whose attention
// reads `mean_context` cached positions per sequence on average.
StepBytes DecodeStepBytes(const model::ModelConfig& config, int batch, double mean_context,
                          const StepBytesOptions& options = {});

// ---- Implementation ----

inline nlohmann::json StepBytes::ToJson() const {
  return {{"attention_weights", attention_weights},
          {"routers", routers},
          {"selected_experts", selected_experts},
          {"selected_experts_per_layer", selected_experts_per_layer},
          {"dense_and_shared_mlp", dense_and_shared_mlp},
          {"norms", norms},
          {"lm_head", lm_head},
          {"embedding_rows", embedding_rows},
          {"kv_cache", kv_cache},
          {"extra", extra},
          {"total", total()}};
}

inline double ExpectedDistinctExperts(const model::MoeConfig& moe, int tokens) {
  const double E = static_cast<double>(moe.num_experts), k = static_cast<double>(moe.top_k);
  return E * (1.0 - std::pow(1.0 - k / E, tokens));
}

inline StepBytes DecodeStepBytes(const model::ModelConfig& c, int batch, double mean_context,
                                 const StepBytesOptions& options) {
  const double w = options.weight_bytes_per_element, fp32 = 4.0;
  const double H = static_cast<double>(c.hidden_size), Q = static_cast<double>(c.q_size()),
               K = static_cast<double>(c.kv_size()), D = static_cast<double>(c.head_dim);
  StepBytes b;
  b.norms = fp32 * H;  // the final norm
  if (c.moe) b.selected_experts_per_layer = ExpectedDistinctExperts(*c.moe, batch);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    b.attention_weights += w * (H * (Q + 2 * K) + Q * H);
    b.norms += fp32 * (2 * H + (c.qk_norm ? 2 * D : 0.0));
    if (!c.IsSparseLayer(l)) {
      b.dense_and_shared_mlp += w * 3 * H * static_cast<double>(c.intermediate_size);
      continue;
    }
    const model::MoeConfig& moe = *c.moe;
    const double E = static_cast<double>(moe.num_experts);
    b.routers += w * E * H + (moe.has_correction_bias() ? fp32 * E : 0.0);
    b.selected_experts +=
        b.selected_experts_per_layer * w * 3 * H * static_cast<double>(moe.intermediate_size);
    b.dense_and_shared_mlp += w * 3 * H * static_cast<double>(moe.shared_intermediate_size());
  }
  const double head = options.head_bytes_per_element > 0 ? options.head_bytes_per_element : w;
  b.lm_head = head * H * static_cast<double>(c.vocab_size);
  b.embedding_rows = head * H * batch;
  b.kv_cache = batch * mean_context * static_cast<double>(c.num_hidden_layers) * 2 * K *
               options.kv_bytes_per_element;
  b.extra = options.extra_bytes;
  return b;
}

}  // namespace tessera::bench
