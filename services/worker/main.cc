// tessera-worker: serves one model (tessera.v1.Worker) on this host.
//
// Start-up: listen (liveness SERVING, readiness NOT_SERVING) → select the
// kernel backends per op and preflight them → load and check the model →
// build the KV cache and the engine → run one warm-up request → readiness
// SERVING. Any failure is a one-line error and a non-zero exit.
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "kernels/cpu_backend.h"
#include "kernels/registry.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_service.h"
#include "worker/engine/engine.h"
#include "worker/model/weights.h"
#include "worker/runner/cpu_model_runner.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json, *.safetensors). Required.");
ABSL_FLAG(std::string, served_model_name, "", "Name reported to clients; default: the directory");
ABSL_FLAG(std::string, gemm_backend, "auto", "Backend for matrix products, or auto");
ABSL_FLAG(std::string, attention_backend, "auto", "Backend for paged attention, or auto");
ABSL_FLAG(std::string, norm_backend, "auto",
          "Backend for RMSNorm, RoPE, SiLU-mul, embedding and KV writes, or auto");
ABSL_FLAG(std::string, sampling_backend, "auto", "Backend for logits processing and sampling");
ABSL_FLAG(int, tensor_parallel_size, 1, "Ranks the model is sharded over");
ABSL_FLAG(int, block_size, 16, "Tokens per KV-cache block");
ABSL_FLAG(int, kv_cache_blocks, 0, "KV-cache blocks; 0 = from --kv_cache_memory_mb");
ABSL_FLAG(int, kv_cache_memory_mb, 512, "KV-cache size when --kv_cache_blocks is 0");
ABSL_FLAG(int, max_num_seqs, 64, "Requests running (holding KV) at once");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "Tokens computed per engine step");
ABSL_FLAG(int, max_model_len, 0, "Context length (prompt + output); 0 = the model's");
ABSL_FLAG(int, max_waiting, 1024, "Queued requests before Generate answers RESOURCE_EXHAUSTED");
ABSL_FLAG(int, cpu_threads, 0, "Threads for the CPU kernels; 0 = all cores");
ABSL_FLAG(bool, enable_prefix_caching, true, "Reuse KV blocks of shared prompt prefixes");

namespace ts = tessera::services;
namespace tk = tessera::kernels;

namespace {

absl::StatusOr<tk::SelectionReport> SelectBackends(const tk::DeviceDescription& device) {
  tk::BackendOverrides overrides;
  for (const auto& [flag, value] :
       {std::pair<std::string, std::string>{"gemm_backend", absl::GetFlag(FLAGS_gemm_backend)},
        {"attention_backend", absl::GetFlag(FLAGS_attention_backend)},
        {"norm_backend", absl::GetFlag(FLAGS_norm_backend)},
        {"sampling_backend", absl::GetFlag(FLAGS_sampling_backend)}}) {
    if (auto s = tk::ValidateBackendOverride(flag, value); !s.ok()) return s;
    overrides[flag] = value;
  }
  return tk::BuiltinRegistry().SelectAll(device, overrides);
}

}  // namespace

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv, "tessera-worker: serves one model (tessera.v1.Worker)");
  tessera::SetLogService("worker");

  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    return ts::StartupError(absl::InvalidArgumentError("--model is required (a model directory)"));
  }
  if (absl::GetFlag(FLAGS_tensor_parallel_size) != 1) {
    return ts::StartupError(absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel_size=", absl::GetFlag(FLAGS_tensor_parallel_size),
                     ": this build runs one rank per worker; use 1")));
  }
  tk::DeviceDescription device = tk::HostCpuDevice();
  absl::StatusOr<tk::SelectionReport> backends = SelectBackends(device);
  if (!backends.ok()) return ts::StartupError(backends.status());
  absl::StatusOr<tk::CpuKernels> kernels = tk::CpuKernelsFor(*backends);
  if (!kernels.ok()) return ts::StartupError(kernels.status());

  ts::ServerOptions options = ts::ServerOptionsFromFlags("worker");
  ts::ServiceHost host(options);
  // Listen first: liveness answers while the model loads; readiness waits.
  ts::WorkerService service(&host.drain(), [&host](absl::Duration d, std::string why) {
    host.RequestDrain(d, std::move(why));
  });
  host.AddService(&service, "tessera.v1.Worker");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);

  ts::WorkerServiceOptions service_options;
  service_options.model_name = absl::GetFlag(FLAGS_served_model_name).empty()
                                   ? model_dir
                                   : absl::GetFlag(FLAGS_served_model_name);
  service_options.default_drain_deadline = options.drain_deadline;
  service_options.backends = *backends;

  tessera::LogInfo("kernel backends", {{"table", backends->ToTable()}});
  std::unique_ptr<tk::cpu::ThreadPool> pool;
  if (absl::GetFlag(FLAGS_cpu_threads) > 0) {
    pool = std::make_unique<tk::cpu::ThreadPool>(absl::GetFlag(FLAGS_cpu_threads));
  }
  tk::cpu::CpuContext ctx = tk::CpuContextFor(device, pool.get());
  if (auto s = tk::PreflightCpuKernels(*kernels, ctx); !s.ok()) {
    return ts::StartupError(absl::FailedPreconditionError(absl::StrCat(
        "preflight failed on ", device.Summary(), ": ", s.message(),
        "; choose another backend with --gemm_backend/--attention_backend/--norm_backend")));
  }

  absl::StatusOr<std::unique_ptr<tessera::model::LoadedModel>> model =
      tessera::model::LoadModel(model_dir);
  if (!model.ok()) return ts::StartupError(model.status());
  const tessera::model::ModelConfig& config = (*model)->config;
  service_options.architecture = std::string(tessera::model::ArchitectureName(config.architecture));

  tessera::runner::CpuRunnerOptions runner_options;
  runner_options.block_size = absl::GetFlag(FLAGS_block_size);
  runner_options.kernels = &*kernels;
  runner_options.num_threads = absl::GetFlag(FLAGS_cpu_threads);
  int64_t blocks = absl::GetFlag(FLAGS_kv_cache_blocks);
  if (blocks <= 0) {
    int64_t bytes_per_block = int64_t{2} * config.num_hidden_layers * config.kv_size() *
                              runner_options.block_size * static_cast<int64_t>(sizeof(float));
    blocks = (int64_t{absl::GetFlag(FLAGS_kv_cache_memory_mb)} << 20) / bytes_per_block;
  }
  runner_options.num_kv_blocks = blocks;
  auto runner = tessera::runner::CpuModelRunner::Create(model->get(), runner_options);
  if (!runner.ok()) return ts::StartupError(runner.status());

  tessera::engine::EngineOptions engine_options;
  engine_options.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  engine_options.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  engine_options.scheduler.max_model_len = absl::GetFlag(FLAGS_max_model_len) > 0
                                               ? absl::GetFlag(FLAGS_max_model_len)
                                               : static_cast<int>(config.max_position_embeddings);
  engine_options.scheduler.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  engine_options.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  for (int64_t id : config.eos_token_ids) engine_options.eos_token_ids.push_back(id);
  if (auto s = tessera::model::CheckContextLength(config, engine_options.scheduler.max_model_len);
      !s.ok()) {
    return ts::StartupError(s);
  }

  ts::WorkerMetrics metrics(host.metrics().registry());
  auto engine = tessera::engine::Engine::Create(std::move(*runner), engine_options, &metrics);
  if (!engine.ok()) return ts::StartupError(engine.status());

  (*engine)->Start();
  service.AttachEngine(engine->get(), service_options);

  // Warm-up: one tiny greedy request through the whole path.
  tessera::engine::EngineRequest warmup;
  warmup.request_id = "warm-up";
  warmup.prompt = {0};
  warmup.max_tokens = 1;
  warmup.sampling.temperature = 0;
  auto stream = (*engine)->Submit(warmup);
  tessera::engine::StreamEvent event;
  bool ok = stream.ok();
  while (ok && (*stream)->Next(&event, absl::Seconds(60))) {
    if (!event.error.ok()) ok = false;
    if (event.finished) break;
  }
  if (!ok || !event.finished) {
    return ts::StartupError(absl::InternalError(
        absl::StrCat("warm-up request failed: ",
                     stream.ok() ? event.error.ToString() : stream.status().ToString())));
  }
  tessera::LogInfo("ready", {{"model", service_options.model_name},
                             {"architecture", service_options.architecture},
                             {"kv_blocks", blocks},
                             {"max_model_len", engine_options.scheduler.max_model_len}});
  service.SetReady(true);
  host.SetReady(true);
  int code = host.RunUntilShutdown();
  (*engine)->Stop();
  return code;
}
