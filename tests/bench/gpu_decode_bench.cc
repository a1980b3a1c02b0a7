// gpu_decode_bench: decode speed of the CUDA runner on a Llama-3-8B-shaped
// model with random bf16 weights (speed does not depend on the values), as
// a fraction of the HBM roofline.
//
// Per batch size B: B prompts of --prompt_len random tokens are prefilled in
// one step, then --decode_steps greedy decode steps run (argmax on the GPU,
// only token ids come back), each a CUDA graph. Reported per B:
//   decode_tokens_per_second = B * steps / wall time of the decode steps
//   bytes_per_step           = what the step reads (step_bytes in the JSON,
//                              decode_step_bytes.h): the layers' weights, the
//                              LM head, one embedding row per token (not the
//                              table) and the KV cache attention reads (mean
//                              context over the steps)
//   roofline_tokens_per_second = B * hbm_bytes_per_second / bytes_per_step
//   roofline_fraction        = measured / roofline
//   gpu_ms_per_step          = device time of one step: the last step's
//                              graph (+ its argmax) replayed --decode_steps
//                              times back to back, timed by events (the last
//                              step has the longest context, so this is at
//                              most a little above the mean step's)
//   host_overhead_fraction   = 1 - gpu_ms_per_step / decode_ms_per_step: the
//                              share of a step's wall time the GPU waits
//                              for the host (staging, launches, the copy of
//                              the token ids back, the next batch)
// --model=qwen3_8b takes Qwen3-8B's shapes instead (per-head q/k norms).
// --model=qwen3_30b_a3b takes Qwen3-30B-A3B's (mixture of experts: 128
// experts, top-8): a step then reads only the experts its tokens select,
// E (1 - (1 - k/E)^B) per layer for B tokens under uniform routing (random
// routers and random tokens route about uniformly); at B = 64 that is
// 125.9 of 128. The long prefill's TFLOP/s counts active FLOPs (attention,
// router, k experts per token).
// --fp8: the layers in fine-grained FP8 (random e4m3, 128x128 block
// scales; tests/bench/random_fp8_cuda_weights.h): 1 byte per layer weight
// plus the scales in the roofline, the embedding and LM head in bf16.
// Usage: gpu_decode_bench [--batch_sizes=1,8,64] [--prompt_len=128] [--fp8]
//        [--decode_steps=128] [--hbm_tbps=4.27] [--out=result.json]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"
#include "nlohmann/json.hpp"
#include "tests/bench/cuda_runner_bench_peer.h"
#include "tests/bench/decode_step_bytes.h"
#include "tests/bench/llama3_8b_config.h"
#include "tests/bench/qwen3_30b_a3b_config.h"
#include "tests/bench/qwen3_8b_config.h"
#include "tests/bench/random_cuda_weights.h"
#include "tests/bench/random_fp8_cuda_weights.h"
#include "worker/model/config.h"
#include "worker/runner/cuda/cuda_model_runner.h"

ABSL_FLAG(std::vector<std::string>, batch_sizes, std::vector<std::string>({"1", "8", "64"}),
          "decode batch sizes");
ABSL_FLAG(int, prompt_len, 128, "prompt tokens per sequence");
ABSL_FLAG(int, decode_steps, 128, "decode steps timed per batch size");
ABSL_FLAG(double, hbm_tbps, 4.27, "measured HBM bandwidth (TB/s), the roofline's ceiling");
ABSL_FLAG(bool, cuda_graphs, true, "run decode steps as CUDA graphs");
ABSL_FLAG(std::string, device, "cuda", "device selector (cuda or cuda:<PCI bus id>)");
ABSL_FLAG(std::string, model, "llama3_8b", "model shapes: llama3_8b, qwen3_8b or qwen3_30b_a3b");
ABSL_FLAG(std::string, out, "", "write the JSON here too");
ABSL_FLAG(int, long_prefill, 4096,
          "also time the prefill of one prompt this long (0 = skip): TFLOP/s counting the "
          "model's matmuls and causal attention, against --peak_tflops");
ABSL_FLAG(double, peak_tflops, 785, "measured bf16 GEMM peak (TFLOP/s) for the prefill fraction");
ABSL_FLAG(bool, fp8, false,
          "random fine-grained FP8 layers (e4m3, 128x128 block scales, activations per token "
          "group of 128; embedding and LM head bf16); the roofline counts 1 byte per layer weight "
          "plus the scales (dense models only)");
ABSL_FLAG(std::string, fp8_gemm_backend, "auto",
          "--fp8: the FP8 prefill (auto = the registry's choice, cublaslt-fp8-block or "
          "cuda-fp8-dequant)");

namespace tessera {
namespace {

// The shapes --model names: its config.json and a description.
struct BenchModel {
  const char* config_json;
  const char* description;
};

bool FindModel(const std::string& name, BenchModel* out) {
  if (name == "llama3_8b") {
    *out = {kLlama3_8BConfig, "Llama-3-8B shapes, random bf16 weights"};
  } else if (name == "qwen3_8b") {
    *out = {kQwen3_8BConfig, "Qwen3-8B shapes, random bf16 weights"};
  } else if (name == "qwen3_30b_a3b") {
    *out = {kQwen3_30BA3BConfig, "Qwen3-30B-A3B shapes (MoE), random bf16 weights"};
  } else {
    return false;
  }
  return true;
}

// The long prefill's FLOPs of T tokens: the matmuls every token runs (MoE:
// the router and its k experts only) and causal attention.
void PrefillFlops(const model::ModelConfig& c, double T, double* matmul, double* attention) {
  const double H = c.hidden_size, D = c.head_dim, Q = c.q_size(), K = c.kv_size();
  double params = 0;  // multiply-adds per token
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    params += H * (Q + 2 * K) + Q * H;
    if (!c.IsSparseLayer(l)) {
      params += 3 * H * c.intermediate_size;
      continue;
    }
    const model::MoeConfig& moe = *c.moe;
    params += moe.num_experts * H + 3 * H * moe.intermediate_size * moe.top_k +
              3 * H * moe.shared_intermediate_size();
  }
  *matmul = 2 * T * params + 2.0 * H * c.vocab_size;  // LM head: the last token only
  *attention = 2.0 * T * T * D * c.num_attention_heads * c.num_hidden_layers;  // QK^T + PV
}

int Run() {
  const std::string model_name = absl::GetFlag(FLAGS_model);
  BenchModel bench_model;
  if (!FindModel(model_name, &bench_model)) {
    std::fprintf(stderr, "--model must be llama3_8b, qwen3_8b or qwen3_30b_a3b, not %s\n",
                 model_name.c_str());
    return 1;
  }
  absl::StatusOr<model::ModelConfig> config =
      model::ParseModelConfig(bench_model.config_json, model_name);
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<kernels::DeviceDescription> device =
      kernels::ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "device: %s\n", device.status().ToString().c_str());
    return 1;
  }
  std::vector<int> batches;
  for (const std::string& b : absl::GetFlag(FLAGS_batch_sizes)) batches.push_back(std::stoi(b));
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  const int block_size = 16;
  const int blocks_per_seq = (prompt_len + steps + 1 + block_size - 1) / block_size;

  runner::CudaRunnerOptions options;
  options.block_size = block_size;
  options.num_kv_blocks = int64_t{max_batch} * blocks_per_seq + 16;
  options.max_num_seqs = max_batch;
  options.max_num_tokens = std::max(max_batch * prompt_len, 256);
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  // The prefill attention kernel the registry picks for this device, as the
  // worker does.
  absl::StatusOr<kernels::Selection> prefill =
      kernels::BuiltinRegistry().Select(kernels::Op::kAttentionPrefill, *device);
  if (!prefill.ok()) {
    std::fprintf(stderr, "prefill attention: %s\n", prefill.status().ToString().c_str());
    return 1;
  }
  options.prefill_attention_backend = prefill->chosen;
  const bool fp8 = absl::GetFlag(FLAGS_fp8);
  runner::CudaWeightsFactory factory = bench::RandomCudaWeights(1234);
  std::string fp8_prefill;
  if (fp8) {
    config->quantization.emplace();  // fine-grained, 128x128 blocks, dynamic groups of 128
    absl::StatusOr<runner::CudaFp8Prefill> p =
        runner::SelectCudaFp8Prefill(&*device, absl::GetFlag(FLAGS_fp8_gemm_backend));
    if (!p.ok()) {
      std::fprintf(stderr, "fp8: %s\n", p.status().ToString().c_str());
      return 1;
    }
    fp8_prefill = std::string(runner::CudaFp8PrefillName(*p));
    factory = bench::RandomFp8CudaWeights(1234, *p);
  }
  auto runner = runner::CudaModelRunner::Create(*config, factory, *device, options);
  if (!runner.ok()) {
    std::fprintf(stderr, "runner: %s\n", runner.status().ToString().c_str());
    return 1;
  }
  const model::ModelConfig& c = (*runner)->config();
  const double hbm = absl::GetFlag(FLAGS_hbm_tbps) * 1e12;
  nlohmann::json results = nlohmann::json::array();
  std::mt19937 rng(42);
  for (int batch : batches) {
    // Prefill: every prompt in one step.
    runner::ForwardBatch prefill;
    prefill.block_table_stride = blocks_per_seq;
    std::vector<std::vector<int32_t>> tables(batch);
    for (int s = 0; s < batch; ++s) {
      for (int j = 0; j < blocks_per_seq; ++j) tables[s].push_back(s * blocks_per_seq + j);
      std::vector<int32_t> prompt(prompt_len);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
      prefill.AddSequence(prompt, 0, tables[s], block_size, true);
    }
    std::vector<int32_t> next;
    auto t0 = std::chrono::steady_clock::now();
    if (auto s = (*runner)->ForwardGreedy(prefill, &next); !s.ok()) {
      std::fprintf(stderr, "prefill: %s\n", s.ToString().c_str());
      return 1;
    }
    const double prefill_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Decode. Graphs are captured per context bucket: warm up at the last
    // position too (its KV slot is rewritten by the timed steps), so no
    // capture happens inside the timed loop.
    auto decode_step = [&](int pos) -> absl::Status {
      runner::ForwardBatch d;
      d.block_table_stride = blocks_per_seq;
      for (int s = 0; s < batch; ++s) d.AddSequence({next[s]}, pos, tables[s], block_size, true);
      return (*runner)->ForwardGreedy(d, &next);
    };
    const std::vector<int32_t> first = next;
    for (int pos : {prompt_len + steps, prompt_len}) {
      next = first;
      if (auto s = decode_step(pos); !s.ok()) {
        std::fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    t0 = std::chrono::steady_clock::now();
    for (int i = 1; i <= steps; ++i) {
      if (auto s = decode_step(prompt_len + i); !s.ok()) {
        std::fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double decode_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double gpu_ms_per_step = -1;
    if (options.cuda_graphs) {
      absl::StatusOr<double> gpu_ms =
          bench::CudaRunnerBenchPeer::ReplayLastDecodeGraphMs(**runner, steps, batch);
      if (!gpu_ms.ok()) {
        std::fprintf(stderr, "graph replay: %s\n", gpu_ms.status().ToString().c_str());
        return 1;
      }
      gpu_ms_per_step = *gpu_ms;
    }
    const double mean_ctx = prompt_len + 1 + (steps + 1) / 2.0;
    bench::StepBytesOptions bytes_options;
    if (fp8) {
      bytes_options.weight_bytes_per_element = 1;
      bytes_options.head_bytes_per_element = 2;
      bytes_options.extra_bytes = bench::Fp8ScaleBytes(c, parallel::FullPlan(c));
    }
    const bench::StepBytes step_bytes = bench::DecodeStepBytes(c, batch, mean_ctx, bytes_options);
    const double bytes_per_step = step_bytes.total();
    const double tps = batch * steps / decode_s;
    const double roofline = batch * hbm / bytes_per_step;
    nlohmann::json r = {
        {"batch", batch},
        {"prompt_len", prompt_len},
        {"decode_steps", steps},
        {"prefill_seconds", prefill_s},
        {"prefill_tokens_per_second", batch * prompt_len / prefill_s},
        {"decode_ms_per_step", 1e3 * decode_s / steps},
        {"decode_tokens_per_second", tps},
        {"bytes_per_step", bytes_per_step},
        {"roofline_tokens_per_second", roofline},
        {"roofline_fraction", tps / roofline},
    };
    r["step_bytes"] = step_bytes.ToJson();
    if (gpu_ms_per_step > 0) {
      const double wall_ms = 1e3 * decode_s / steps;
      r["gpu_ms_per_step"] = gpu_ms_per_step;
      r["host_ms_per_step"] = wall_ms - gpu_ms_per_step;
      r["host_overhead_fraction"] = 1.0 - gpu_ms_per_step / wall_ms;
      r["gpu_only_tokens_per_second"] = batch / (gpu_ms_per_step * 1e-3);
      r["gpu_only_roofline_fraction"] = batch / (gpu_ms_per_step * 1e-3) / roofline;
    }
    std::fprintf(stderr, "%s\n", r.dump().c_str());
    results.push_back(r);
  }
  // One long prompt: the prefill against the tensor-core peak.
  nlohmann::json long_prefill = nullptr;
  const int long_len = absl::GetFlag(FLAGS_long_prefill);
  if (long_len > 0 && long_len <= options.max_num_tokens &&
      (long_len + block_size - 1) / block_size <= options.num_kv_blocks) {
    runner::ForwardBatch b;
    const int blocks = (long_len + block_size - 1) / block_size;
    b.block_table_stride = blocks;
    std::vector<int32_t> table(blocks), prompt(long_len);
    for (int j = 0; j < blocks; ++j) table[j] = j;
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    b.AddSequence(prompt, 0, table, block_size, true);
    std::vector<int32_t> next;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // the first run warms up
      auto t0 = std::chrono::steady_clock::now();
      if (auto st = (*runner)->ForwardGreedy(b, &next); !st.ok()) {
        std::fprintf(stderr, "long prefill: %s\n", st.ToString().c_str());
        return 1;
      }
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::min(best, sec);
    }
    double matmul_flops = 0, attention_flops = 0;
    PrefillFlops(c, long_len, &matmul_flops, &attention_flops);
    const double tflops = (matmul_flops + attention_flops) / best / 1e12;
    long_prefill = {{"prompt_tokens", long_len},
                    {"seconds", best},
                    {"matmul_tflop", matmul_flops / 1e12},
                    {"attention_tflop", attention_flops / 1e12},
                    {"tflop_per_s", tflops},
                    {"peak_tflop_per_s", absl::GetFlag(FLAGS_peak_tflops)},
                    {"fraction_of_peak", tflops / absl::GetFlag(FLAGS_peak_tflops)}};
    std::fprintf(stderr, "%s\n", long_prefill.dump().c_str());
  }
  nlohmann::json out = {
      {"benchmark", "gpu_decode_bench"},
      {"long_prefill", long_prefill},
      {"model", absl::StrCat(bench_model.description,
                             fp8 ? "; layers FP8 (e4m3, 128x128 block scales)" : "")},
      {"device", device->Summary()},
      {"weight_bytes", (*runner)->weight_bytes()},
      {"hbm_bytes_per_second", hbm},
      {"cuda_graphs", options.cuda_graphs},
      {"prefill_attention_backend", options.prefill_attention_backend},
      {"fp8", fp8},
      {"fp8_prefill_backend", fp8_prefill},
      {"results", results},
  };
  std::printf("%s\n", out.dump(2).c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << out.dump(2);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
