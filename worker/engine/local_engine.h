// LocalEngine: everything needed to run a model on this host's CPU, built in
// the order a service starts: kernel backends selected per op (with the
// operator's overrides) and preflighted → model loaded and checked → KV
// cache sized → engine created. Used by tessera-worker and `tessera
// generate`, so both start the same way.
//
// Thread-safety: build on one thread; the Engine inside is thread-safe as
// documented in engine.h.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cpu_backend.h"
#include "kernels/registry.h"
#include "worker/engine/engine.h"
#include "worker/model/weights.h"

namespace tessera::engine {

struct LocalEngineOptions {
  std::string model_dir;
  kernels::BackendOverrides backends;  // flag name -> backend ("auto" = choose)
  int cpu_threads = 0;                 // 0 = all cores
  int block_size = 16;
  int64_t kv_cache_blocks = 0;  // 0 = from kv_cache_memory_mb
  int64_t kv_cache_memory_mb = 512;
  int max_model_len = 0;  // 0 = the model's
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_waiting = 1024;
  bool enable_prefix_caching = true;
};

struct LocalEngine {
  kernels::DeviceDescription device;
  kernels::SelectionReport backends;
  std::unique_ptr<kernels::CpuKernels> kernels;
  std::unique_ptr<kernels::cpu::ThreadPool> pool;
  std::unique_ptr<model::LoadedModel> model;
  int64_t kv_cache_blocks = 0;
  std::unique_ptr<Engine> engine;  // not started

  ~LocalEngine();  // stops the engine before the model goes away
};

// Builds the engine. Errors say which step failed and why (an unknown or
// unusable backend, a failed preflight, a bad model directory, ...).
absl::StatusOr<std::unique_ptr<LocalEngine>> BuildLocalEngine(const LocalEngineOptions& options,
                                                              EngineObserver* observer = nullptr);

// Runs one tiny greedy request through a started engine (warm-up).
absl::Status WarmUp(Engine& engine);

}  // namespace tessera::engine
