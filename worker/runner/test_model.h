// Test support: writes a small random decoder checkpoint (config.json +
// model.safetensors) into a directory, for runner and engine tests that need
// a model but not a particular one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/dtype.h"
#include "worker/model/safetensors_writer.h"

namespace tessera::runner {

struct TestModelSpec {
  std::string architecture = "Qwen3ForCausalLM";
  int vocab = 256;
  int hidden = 64;
  int intermediate = 128;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int max_positions = 4096;
  bool tie_embeddings = false;
  model::DType dtype = model::DType::kF32;
  float weight_scale = 0.15f;
  uint64_t seed = 7;

  // Mixture of experts, for "Qwen3MoeForCausalLM" (softmax routing) and
  // "Glm4MoeForCausalLM" (sigmoid grouped routing with a correction bias,
  // shared experts, q/k/v bias, q/k norm, partial RoPE 0.5).
  int experts = 8;
  int top_k = 2;
  int expert_intermediate = 32;
  int shared_experts = 1;  // GLM only
  int groups = 1;          // GLM only
  int topk_groups = 1;     // GLM only
  double routed_scaling = 1.0;
  bool norm_topk_prob = true;
  int first_dense_layers = 0;  // Qwen: mlp_only_layers = [0, n); GLM: first_k_dense_replace

  // "DeepseekV3ForCausalLM": multi-head latent attention (kv_heads =
  // heads; head_dim unused) with GLM's routing keys above; shared experts
  // and groups as for GLM.
  int q_lora_rank = 24;  // 0: a plain q_proj
  int kv_lora_rank = 32;
  int qk_nope_head_dim = 16;
  int qk_rope_head_dim = 8;
  int v_head_dim = 12;
  bool rope_interleave = true;
  bool yarn = true;  // rope_scaling yarn, factor 4 over 256 positions, mscale 1 / all_dim 0.5
  // Called on the tensors before they are written (to craft a router, ...).
  std::function<void(std::vector<model::TensorToWrite>*)> edit_tensors;
};

// A bf16 model big enough that a decode step takes visible time on one CPU
// thread (a few milliseconds): for tests of timing, streaming and drain.
inline TestModelSpec SlowDecodeSpec() {
  TestModelSpec spec;
  spec.vocab = 1024;
  spec.hidden = 512;
  spec.intermediate = 1024;
  spec.layers = 4;
  spec.heads = 8;
  spec.kv_heads = 4;
  spec.head_dim = 64;
  spec.dtype = model::DType::kBF16;
  return spec;
}

// Writes the model into `dir` (which must exist).
absl::Status WriteTestModel(const std::string& dir, const TestModelSpec& spec);

}  // namespace tessera::runner
