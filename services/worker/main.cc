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
#include "kernels/registry.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_service.h"
#include "worker/engine/local_engine.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json, *.safetensors); or --simulate");
ABSL_FLAG(std::string, simulate, "",
          "Run a simulated model instead of --model (for cluster tests and benchmarks), e.g. "
          "'vocab=1024,context=32768,prefill_us_per_token=20,decode_step_us=2000'");
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

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv, "tessera-worker: serves one model (tessera.v1.Worker)");
  tessera::SetLogService("worker");

  tessera::engine::LocalEngineOptions lo;
  lo.model_dir = absl::GetFlag(FLAGS_model);
  if (!absl::GetFlag(FLAGS_simulate).empty()) {
    auto sim = tessera::engine::ParseSimulationSpec(absl::GetFlag(FLAGS_simulate));
    if (!sim.ok()) return ts::StartupError(sim.status());
    lo.simulate = *sim;
    lo.model_dir = "simulated";
  } else if (lo.model_dir.empty()) {
    return ts::StartupError(absl::InvalidArgumentError("--model is required (a model directory)"));
  }
  if (absl::GetFlag(FLAGS_tensor_parallel_size) != 1) {
    return ts::StartupError(absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel_size=", absl::GetFlag(FLAGS_tensor_parallel_size),
                     ": this build runs one rank per worker; use 1")));
  }
  lo.backends = {{"gemm_backend", absl::GetFlag(FLAGS_gemm_backend)},
                 {"attention_backend", absl::GetFlag(FLAGS_attention_backend)},
                 {"norm_backend", absl::GetFlag(FLAGS_norm_backend)},
                 {"sampling_backend", absl::GetFlag(FLAGS_sampling_backend)}};
  for (const auto& [flag, value] : lo.backends) {
    if (auto s = tessera::kernels::ValidateBackendOverride(flag, value); !s.ok()) {
      return ts::StartupError(s);
    }
  }
  lo.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  lo.block_size = absl::GetFlag(FLAGS_block_size);
  lo.kv_cache_blocks = absl::GetFlag(FLAGS_kv_cache_blocks);
  lo.kv_cache_memory_mb = absl::GetFlag(FLAGS_kv_cache_memory_mb);
  lo.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  lo.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  lo.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  lo.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  lo.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);

  ts::ServerOptions options = ts::ServerOptionsFromFlags("worker");
  if (auto s = ts::ValidateServerOptions(options); !s.ok()) return ts::StartupError(s);
  ts::ServiceHost host(options);
  // Listen first: liveness answers while the model loads; readiness waits
  // for preflight, loading and warm-up.
  ts::WorkerService service(&host.drain(), [&host](absl::Duration d, std::string why) {
    host.RequestDrain(d, std::move(why));
  });
  host.AddService(&service, "tessera.v1.Worker");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);

  ts::WorkerMetrics metrics(host.metrics().registry());
  auto local = tessera::engine::BuildLocalEngine(lo, &metrics);
  if (!local.ok()) return ts::StartupError(local.status());
  tessera::engine::Engine& engine = *(*local)->engine;
  tessera::LogInfo("kernel backends", {{"table", (*local)->backends.ToTable()}});

  ts::WorkerServiceOptions service_options;
  service_options.model_name = absl::GetFlag(FLAGS_served_model_name).empty()
                                   ? lo.model_dir
                                   : absl::GetFlag(FLAGS_served_model_name);
  service_options.architecture = std::string(
      tessera::model::ArchitectureName((*local)->engine->runner().config().architecture));
  service_options.default_drain_deadline = options.drain_deadline;
  service_options.backends = (*local)->backends;
  engine.Start();
  service.AttachEngine(&engine, service_options);
  if (auto s = tessera::engine::WarmUp(engine); !s.ok()) {
    return ts::StartupError(absl::InternalError(absl::StrCat("warm-up failed: ", s.ToString())));
  }
  tessera::LogInfo("ready", {{"model", service_options.model_name},
                             {"architecture", service_options.architecture},
                             {"kv_blocks", (*local)->kv_cache_blocks},
                             {"max_model_len", engine.options().scheduler.max_model_len}});
  service.SetReady(true);
  host.SetReady(true);
  int code = host.RunUntilShutdown();
  engine.Stop();
  return code;
}
