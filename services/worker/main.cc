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
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/worker/draft_client.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_service.h"
#include "worker/engine/local_engine.h"
#include "worker/engine/preflight_process.h"
#include "worker/spec/model_source.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json, *.safetensors); or --simulate");
ABSL_FLAG(std::string, simulate, "",
          "Run a simulated model instead of --model (for cluster tests and benchmarks), e.g. "
          "'vocab=1024,context=32768,prefill_us_per_token=20,decode_step_us=2000'");
ABSL_FLAG(std::string, served_model_name, "", "Name reported to clients; default: the directory");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model runs: cpu, cuda (the one visible GPU) or cuda:<PCI bus id>, "
          "e.g. cuda:0000:18:00.0 (see `tessera doctor`)");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "CUDA: share of the GPU memory left after weights that the KV cache takes when "
          "--kv_cache_blocks is 0");
ABSL_FLAG(bool, cuda_graphs, true, "CUDA: run decode steps as CUDA graphs");
ABSL_FLAG(std::string, gemm_backend, "auto", "Backend for matrix products, or auto");
ABSL_FLAG(std::string, attention_backend, "auto", "Backend for paged attention, or auto");
ABSL_FLAG(std::string, norm_backend, "auto",
          "Backend for RMSNorm, RoPE, SiLU-mul, embedding and KV writes, or auto");
ABSL_FLAG(std::string, sampling_backend, "auto", "Backend for logits processing and sampling");
ABSL_FLAG(std::string, all_reduce_backend, "auto",
          "Backend for the all-reduce between tensor-parallel ranks (p2p, nccl, ...), or auto");
ABSL_FLAG(int, tensor_parallel_size, 1,
          "Tensor-parallel ranks the model is sharded over (CPU: one thread per rank)");
ABSL_FLAG(std::string, moe_parallel, "tensor",
          "How tensor-parallel ranks split a mixture-of-experts model's routed experts: tensor "
          "(a slice of every expert per rank) or expert (whole experts per rank)");
ABSL_FLAG(std::string, moe_backend, "auto",
          "Backend for mixture-of-experts routing and expert MLPs, or auto");
ABSL_FLAG(int, block_size, 16, "Tokens per KV-cache block");
ABSL_FLAG(int, kv_cache_blocks, 0, "KV-cache blocks; 0 = from --kv_cache_memory_mb");
ABSL_FLAG(int, kv_cache_memory_mb, 512, "KV-cache size when --kv_cache_blocks is 0");
ABSL_FLAG(int, max_num_seqs, 64, "Requests running (holding KV) at once");
ABSL_FLAG(int, max_num_batched_tokens, 256,
          "Tokens computed per engine step (decodes first, then prefill chunks): bounds how "
          "much a prefill wave slows the running decodes; 256 is about the GEMM ridge point of "
          "an H100/H200 (docs/serving.md)");
ABSL_FLAG(int, max_model_len, 0, "Context length (prompt + output); 0 = the model's");
ABSL_FLAG(int, max_waiting, 1024, "Queued requests before Generate answers RESOURCE_EXHAUSTED");
ABSL_FLAG(int, cpu_threads, 0, "Threads for the CPU kernels; 0 = all cores");
ABSL_FLAG(bool, enable_prefix_caching, true, "Reuse KV blocks of shared prompt prefixes");
ABSL_FLAG(std::string, drafter, "", "Drafter address (host:port) for speculative decoding");
ABSL_FLAG(std::string, draft_source, "",
          "In-process speculative decoding without a drafter: ngram, suffix or model");
ABSL_FLAG(std::string, draft_model, "", "Draft model directory for --draft_source=model");
ABSL_FLAG(int, spec_deadline_ms, 5, "Longest wait per step for the drafter's proposals");
ABSL_FLAG(int, num_speculative_tokens, 4,
          "Most draft tokens verified per sequence and step; 0 disables speculation");
ABSL_FLAG(bool, spec_adaptive, true,
          "Adapt the draft length to acceptance and batch size (false = always "
          "--num_speculative_tokens)");
ABSL_FLAG(int, spec_disable_batch_size, 32,
          "With --spec_adaptive, no speculation at this many decoding sequences");
ABSL_FLAG(int, spec_tree_branching, 1,
          "With --draft_source: token trees with at most this many candidates per position "
          "(1 = chains); verified in one pass with a tree attention mask on the CPU and CUDA "
          "runners (first-child chains on the simulated and CPU tensor-parallel runners)");

namespace ts = tessera::services;

int main(int argc, char** argv) {
  // This binary again as the CUDA preflight's child (preflight_process.h).
  if (int rc = tessera::engine::RunPreflightChildIfAsked(argc, argv); rc >= 0) return rc;
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
  // Ranks are threads of this process (worker/parallel): CPU ranks share the
  // host; CUDA ranks take one GPU each, meeting through NCCL.
  lo.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  if (lo.tensor_parallel_size < 1) {
    return ts::StartupError(absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel_size=", lo.tensor_parallel_size, ": must be >= 1")));
  }
  lo.backends = {{"gemm_backend", absl::GetFlag(FLAGS_gemm_backend)},
                 {"attention_backend", absl::GetFlag(FLAGS_attention_backend)},
                 {"norm_backend", absl::GetFlag(FLAGS_norm_backend)},
                 {"sampling_backend", absl::GetFlag(FLAGS_sampling_backend)},
                 {"all_reduce_backend", absl::GetFlag(FLAGS_all_reduce_backend)},
                 {"moe_backend", absl::GetFlag(FLAGS_moe_backend)}};
  lo.moe_parallel = absl::GetFlag(FLAGS_moe_parallel);
  for (const auto& [flag, value] : lo.backends) {
    if (auto s = tessera::kernels::ValidateBackendOverride(flag, value); !s.ok()) {
      return ts::StartupError(s);
    }
  }
  lo.device = absl::GetFlag(FLAGS_device);
  lo.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  if (!(lo.gpu_memory_fraction > 0 && lo.gpu_memory_fraction <= 1)) {
    return ts::StartupError(absl::InvalidArgumentError("--gpu_memory_fraction must be in (0, 1]"));
  }
  lo.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  lo.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  lo.block_size = absl::GetFlag(FLAGS_block_size);
  lo.kv_cache_blocks = absl::GetFlag(FLAGS_kv_cache_blocks);
  lo.kv_cache_memory_mb = absl::GetFlag(FLAGS_kv_cache_memory_mb);
  lo.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  lo.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  lo.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  lo.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  lo.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  lo.speculation.num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  lo.speculation.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  lo.speculation.disable_batch_size = absl::GetFlag(FLAGS_spec_disable_batch_size);
  const std::string drafter = absl::GetFlag(FLAGS_drafter);
  const std::string draft_source = absl::GetFlag(FLAGS_draft_source);
  if (!drafter.empty() && !draft_source.empty()) {
    return ts::StartupError(
        absl::InvalidArgumentError("--drafter and --draft_source exclude each other"));
  }
  tessera::spec::TreeOptions tree;
  tree.max_branching = absl::GetFlag(FLAGS_spec_tree_branching);
  if (tree.max_branching < 1 || tree.max_branching > 16) {
    return ts::StartupError(absl::InvalidArgumentError("--spec_tree_branching must be in [1, 16]"));
  }
  if (absl::GetFlag(FLAGS_spec_deadline_ms) < 0 || lo.speculation.num_speculative_tokens < 0 ||
      lo.speculation.num_speculative_tokens > 64 || lo.speculation.disable_batch_size < 1) {
    return ts::StartupError(absl::InvalidArgumentError(
        "--spec_deadline_ms must be >= 0, --num_speculative_tokens in [0, 64] and "
        "--spec_disable_batch_size >= 1"));
  }

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
  if (!drafter.empty()) {
    ts::DraftClientOptions dco;
    dco.target = drafter;
    dco.deadline = absl::Milliseconds(absl::GetFlag(FLAGS_spec_deadline_ms));
    lo.draft_provider = std::make_shared<ts::DraftClient>(dco, &metrics);
  } else if (draft_source == "ngram") {
    tessera::spec::NgramOptions no;
    no.tree = tree;
    lo.draft_provider =
        std::make_shared<tessera::spec::LocalDraftProvider>(tessera::spec::MakeNgramSource(no));
  } else if (draft_source == "suffix") {
    tessera::spec::SuffixOptions so;
    so.tree = tree;
    lo.draft_provider =
        std::make_shared<tessera::spec::LocalDraftProvider>(tessera::spec::MakeSuffixSource(so));
  } else if (draft_source == "model") {
    // The draft model runs where the target does (the first rank's GPU).
    tessera::spec::ModelSourceFromDirOptions dopt;
    dopt.source.tree = tree;
    if (lo.device != "cpu") {
      auto devices = tessera::kernels::ResolveDevices(lo.device, lo.tensor_parallel_size);
      if (!devices.ok()) return ts::StartupError(devices.status());
      dopt.device = absl::StrCat("cuda:", devices->front().gpu->pci_bus_id);
    }
    auto source = tessera::spec::MakeModelSourceFromDir(absl::GetFlag(FLAGS_draft_model), dopt);
    if (!source.ok()) return ts::StartupError(source.status());
    lo.draft_provider = std::make_shared<tessera::spec::LocalDraftProvider>(std::move(*source));
  } else if (!draft_source.empty()) {
    return ts::StartupError(absl::InvalidArgumentError(
        absl::StrCat("--draft_source=", draft_source, ": expected ngram, suffix or model")));
  }
  auto local = tessera::engine::BuildLocalEngine(lo, &metrics);
  lo.draft_provider.reset();  // the engine holds it; it goes before `metrics`
  if (!local.ok()) return ts::StartupError(local.status());
  tessera::engine::Engine& engine = *(*local)->engine;
  tessera::LogInfo("kernel backends", {{"table", (*local)->backends.ToTable()}});

  ts::WorkerServiceOptions service_options;
  service_options.model_name = absl::GetFlag(FLAGS_served_model_name).empty()
                                   ? lo.model_dir
                                   : absl::GetFlag(FLAGS_served_model_name);
  service_options.architecture = std::string(
      tessera::model::ArchitectureName((*local)->engine->runner().config().architecture));
  service_options.tensor_parallel_size = lo.tensor_parallel_size;
  service_options.default_drain_deadline = options.drain_deadline;
  service_options.backends = (*local)->backends;
  // A runner that can run no more steps (a tensor-parallel group whose
  // ranks fell out of step): the worker leaves service here, the engine then
  // fails its requests with UNAVAILABLE, which routers retry elsewhere, and
  // the process drains and exits with kExitServiceFailed (exit_codes.h) for
  // its supervisor to start it afresh.
  engine.OnRunnerFailed([&service, &host](const absl::Status& why) {
    service.SetReady(false);
    host.RequestFailureExit(absl::StrCat("model runner failed: ", why.message()));
  });
  engine.Start();
  service.AttachEngine(&engine, service_options);
  if (auto s = tessera::engine::WarmUp(engine); !s.ok()) {
    return ts::StartupError(absl::InternalError(absl::StrCat("warm-up failed: ", s.ToString())));
  }
  tessera::LogInfo("ready", {{"model", service_options.model_name},
                             {"architecture", service_options.architecture},
                             {"kv_blocks", (*local)->kv_cache_blocks},
                             {"tensor_parallel_size", lo.tensor_parallel_size},
                             {"max_model_len", engine.options().scheduler.max_model_len}});
  service.SetReady(true);
  host.SetReady(true);
  int code = host.RunUntilShutdown();
  engine.Stop();
  return code;
}
