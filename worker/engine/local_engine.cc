#include "worker/engine/local_engine.h"

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::engine {

LocalEngine::~LocalEngine() {
  if (engine) engine->Stop();
}

absl::StatusOr<std::unique_ptr<LocalEngine>> BuildLocalEngine(const LocalEngineOptions& o,
                                                              EngineObserver* observer) {
  auto local = std::make_unique<LocalEngine>();
  local->device = kernels::HostCpuDevice();
  for (const auto& [flag, value] : o.backends) {
    if (auto s = kernels::ValidateBackendOverride(flag, value); !s.ok()) return s;
  }
  auto report = kernels::BuiltinRegistry().SelectAll(local->device, o.backends);
  if (!report.ok()) return report.status();
  local->backends = *report;
  auto cpu_kernels = kernels::CpuKernelsFor(*report);
  if (!cpu_kernels.ok()) return cpu_kernels.status();
  local->kernels = std::make_unique<kernels::CpuKernels>(*cpu_kernels);
  if (o.cpu_threads > 0) local->pool = std::make_unique<kernels::cpu::ThreadPool>(o.cpu_threads);
  kernels::cpu::CpuContext ctx = kernels::CpuContextFor(local->device, local->pool.get());
  if (auto s = kernels::PreflightCpuKernels(*local->kernels, ctx); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "preflight failed on ", local->device.Summary(), ": ", s.message(),
        "; choose another backend with --gemm_backend/--attention_backend/--norm_backend"));
  }

  auto model = model::LoadModel(o.model_dir);
  if (!model.ok()) return model.status();
  local->model = std::move(*model);
  const model::ModelConfig& config = local->model->config;

  runner::CpuRunnerOptions ro;
  ro.block_size = o.block_size;
  ro.kernels = local->kernels.get();
  ro.num_threads = o.cpu_threads;
  int64_t blocks = o.kv_cache_blocks;
  if (blocks <= 0) {
    const int64_t bytes_per_block = int64_t{2} * config.num_hidden_layers * config.kv_size() *
                                    o.block_size * static_cast<int64_t>(sizeof(float));
    blocks = std::max<int64_t>(1, (o.kv_cache_memory_mb << 20) / bytes_per_block);
  }
  ro.num_kv_blocks = blocks;
  local->kv_cache_blocks = blocks;
  auto runner = runner::CpuModelRunner::Create(local->model.get(), ro);
  if (!runner.ok()) return runner.status();

  EngineOptions eo;
  eo.scheduler.max_num_seqs = o.max_num_seqs;
  eo.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  eo.scheduler.max_model_len =
      o.max_model_len > 0 ? o.max_model_len : static_cast<int>(config.max_position_embeddings);
  eo.scheduler.enable_prefix_caching = o.enable_prefix_caching;
  eo.max_waiting = o.max_waiting;
  for (int64_t id : config.eos_token_ids) eo.eos_token_ids.push_back(static_cast<TokenId>(id));
  if (auto s = model::CheckContextLength(config, eo.scheduler.max_model_len); !s.ok()) return s;
  auto engine = Engine::Create(std::move(*runner), eo, observer);
  if (!engine.ok()) return engine.status();
  local->engine = std::move(*engine);
  return local;
}

absl::Status WarmUp(Engine& engine) {
  EngineRequest warmup;
  warmup.request_id = "warm-up";
  warmup.prompt = {0};
  warmup.max_tokens = 1;
  warmup.sampling.temperature = 0;
  auto stream = engine.Submit(warmup);
  if (!stream.ok()) return stream.status();
  StreamEvent event;
  while ((*stream)->Next(&event, absl::Seconds(120))) {
    if (!event.error.ok()) return event.error;
    if (event.finished) return absl::OkStatus();
  }
  return absl::DeadlineExceededError("warm-up request did not finish within 120 s");
}

}  // namespace tessera::engine
