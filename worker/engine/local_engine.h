// LocalEngine: everything needed to run a model on this host's CPU, built in
// the order a service starts: kernel backends selected per op (with the
// operator's overrides) and preflighted → model loaded and checked → KV
// cache sized → engine created. Used by tessera-worker and `tessera
// generate`, so both start the same way.
//
// Tensor parallelism: with tensor_parallel_size N > 1 the model is split
// over N rank threads, on the CPU (worker/parallel/tensor_parallel_runner.h)
// or one GPU each (cuda_tensor_parallel_runner.h); the model's shapes are
// checked against N before any weight is read.
//
// Simulation: with LocalEngineOptions::simulate set, no model is loaded. The
// kernel backends are still selected (and the overrides validated) so the
// report reads as on a real worker, but nothing is preflighted, since no
// kernel runs: the engine runs on a SimulatedModelRunner
// (worker/runner/simulated_model_runner.h) whose Forward waits as long as the
// cost model says and produces deterministic tokens. Scheduling, KV-block
// accounting and the prefix cache are the real ones, so a router sees the
// same load and prefix-cache events as from a real worker. For benchmarks
// of the router with many workers on one machine.
//
// Thread-safety: build on one thread; the Engine inside is thread-safe as
// documented in engine.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu_backend.h"
#include "kernels/registry.h"
#include "worker/engine/engine.h"
#include "worker/model/weights.h"

namespace tessera::engine {

// The synthetic model and its cost model (see simulated_model_runner.h).
struct SimulationOptions {
  int64_t vocab = 1024;     // vocabulary size, [4, 2^20]
  int64_t context = 32768;  // max_position_embeddings
  double prefill_us_per_token = 20;
  double decode_step_us = 2000;
  double decode_us_per_seq = 50;
  // Nominal KV-cache bytes per token, which turns --kv_cache_memory_mb into
  // blocks when kv_cache_blocks is 0. Default: Llama-3-8B in 16-bit
  // (32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes).
  int64_t kv_bytes_per_token = 131072;
  // > 0: the runner breaks for good after this many steps (tests of a
  // worker whose device fails; runner::SimulatedRunnerOptions).
  int64_t fail_after_steps = 0;
  // TEST ONLY (script=<path>): a JSON file {"replies": [[ids...], ...],
  // "switch_tokens": [ids]}; the runner then emits the chosen reply's tokens,
  // then EOS, instead of its hash tokens (runner::SimulatedRunnerOptions).
  std::string script_path;
  std::vector<std::vector<int32_t>> script;
  std::vector<int32_t> script_switch_tokens;
};

// Parses a spec such as
//   "vocab=1024,context=32768,prefill_us_per_token=20,decode_step_us=2000,decode_us_per_seq=50"
// Comma-separated key=value pairs in any order; keys are the field names of
// SimulationOptions; an omitted key keeps its default, so "" means all
// defaults. Spaces around keys and values are ignored. INVALID_ARGUMENT
// naming the pair for an unknown or repeated key, a malformed number or a
// value out of range (costs: finite, in [0, 1e9] us; context in [1, 2^30];
// kv_bytes_per_token >= 1; fail_after_steps >= 0; script: a readable
// file of the shape above, ids in the vocabulary).
absl::StatusOr<SimulationOptions> ParseSimulationSpec(std::string_view spec);

// The canonical spec of `options` (every key, in declaration order); it
// parses back to the same options.
std::string SimulationSpecString(const SimulationOptions& options);

struct LocalEngineOptions {
  // Model directory; ignored when `simulate` is set.
  std::string model_dir;
  // When set, run the simulated runner instead of loading a model.
  std::optional<SimulationOptions> simulate;
  // "cpu", "cuda" (the one visible GPU) or "cuda:<PCI bus id>"
  // (kernels/cuda_devices.h).
  std::string device = "cpu";
  kernels::BackendOverrides backends;  // flag name -> backend ("auto" = choose)
  int cpu_threads = 0;                 // 0 = all cores (shared among the ranks)
  // Tensor-parallel ranks (worker/parallel): N threads each holding 1/N of
  // the model, on the CPU or on N GPUs ("cuda": the first N by PCI bus id,
  // or "cuda:<bus id>,<bus id>,...").
  int tensor_parallel_size = 1;
  // How tensor-parallel CPU ranks split the routed experts of MoE layers:
  // "tensor" (a slice of every expert) or "expert" (whole experts per rank);
  // see worker/parallel/shard_plan.h.
  std::string moe_parallel = "tensor";
  int block_size = 16;
  int64_t kv_cache_blocks = 0;       // 0 = from kv_cache_memory_mb (CPU) or gpu_memory_fraction
  double gpu_memory_fraction = 0.9;  // CUDA: of the memory left after weights, for the KV cache
  bool cuda_graphs = true;           // CUDA: decode steps as CUDA graphs
  // CUDA: the kernel preflight in a child process (preflight_process.h), so
  // that its clears do not slow this process's decode graphs; false, or a
  // binary that cannot run the child: in this process.
  bool preflight_in_child = true;
  int64_t kv_cache_memory_mb = 512;
  int max_model_len = 0;  // 0 = the model's
  int max_num_seqs = 64;
  // The per-step token budget; the worker's default, docs/serving.md.
  int max_num_batched_tokens = 256;
  int max_waiting = 1024;
  bool enable_prefix_caching = true;
  // Speculative decoding (engine.h): off unless a provider is given.
  spec::SpeculationOptions speculation;
  std::shared_ptr<spec::DraftProvider> draft_provider;
};

struct LocalEngine {
  kernels::DeviceDescription device;
  kernels::SelectionReport backends;
  std::unique_ptr<kernels::CpuKernels> kernels;
  std::unique_ptr<kernels::cpu::ThreadPool> pool;
  std::unique_ptr<model::LoadedModel> model;  // null when simulated
  bool simulated = false;
  int64_t kv_cache_blocks = 0;
  std::unique_ptr<Engine> engine;  // not started

  // The model's config (the synthetic one when simulated).
  const model::ModelConfig& config() const { return engine->runner().config(); }

  ~LocalEngine();  // stops the engine before the model goes away
};

// Builds the engine. Errors say which step failed and why (an unknown or
// unusable backend, a failed preflight, a bad model directory, simulation
// options out of range, ...).
absl::StatusOr<std::unique_ptr<LocalEngine>> BuildLocalEngine(const LocalEngineOptions& options,
                                                              EngineObserver* observer = nullptr);

// Runs one tiny greedy request through a started engine (warm-up).
absl::Status WarmUp(Engine& engine);

}  // namespace tessera::engine
