// tessera-worker: serves tessera.v1.Worker for one model on this host.
#include <string>

#include "absl/flags/flag.h"
#include "base/log.h"
#include "kernels/registry.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/worker/worker_service.h"

ABSL_FLAG(std::string, gemm_backend, "auto", "Backend for matrix products, or auto");
ABSL_FLAG(std::string, attention_backend, "auto", "Backend for paged attention, or auto");
ABSL_FLAG(std::string, norm_backend, "auto",
          "Backend for RMSNorm, RoPE, SiLU-mul and embedding, or auto");
ABSL_FLAG(std::string, sampling_backend, "auto", "Backend for logits processing and sampling");
ABSL_FLAG(int, tensor_parallel_size, 1, "Number of GPUs (or CPU ranks) the model is sharded over");

namespace ts = tessera::services;

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv, "tessera-worker: serves one model (tessera.v1.Worker)");
  tessera::SetLogService("worker");

  const std::pair<const char*, std::string> backends[] = {
      {"gemm_backend", absl::GetFlag(FLAGS_gemm_backend)},
      {"attention_backend", absl::GetFlag(FLAGS_attention_backend)},
      {"norm_backend", absl::GetFlag(FLAGS_norm_backend)},
      {"sampling_backend", absl::GetFlag(FLAGS_sampling_backend)},
  };
  for (const auto& [flag, value] : backends) {
    if (auto s = tessera::kernels::ValidateBackendOverride(flag, value); !s.ok()) {
      return ts::StartupError(s);
    }
  }
  if (absl::GetFlag(FLAGS_tensor_parallel_size) < 1) {
    return ts::StartupError(absl::InvalidArgumentError("--tensor_parallel_size must be >= 1"));
  }

  ts::ServerOptions options = ts::ServerOptionsFromFlags("worker");
  ts::ServiceHost host(options);
  ts::WorkerServiceOptions worker_options;
  worker_options.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  worker_options.default_drain_deadline = options.drain_deadline;
  ts::WorkerService service(
      worker_options, &host.drain(),
      [&host](absl::Duration d, std::string why) { host.RequestDrain(d, std::move(why)); });
  host.AddService(&service, "tessera.v1.Worker");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);
  host.SetReady(true);
  return host.RunUntilShutdown();
}
