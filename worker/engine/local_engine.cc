#include "worker/engine/local_engine.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/json.h"
#include "base/log.h"
#include "kernels/cuda_devices.h"
#include "worker/engine/preflight_process.h"
#include "worker/model/capabilities.h"
#include "worker/model/kv_cache_size.h"
#include "worker/parallel/shard_plan.h"
#include "worker/parallel/tensor_parallel_runner.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/simulated_model_runner.h"
#if TESSERA_HAVE_CUDA
#include "worker/parallel/cuda_tensor_parallel_runner.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#endif

namespace tessera::engine {
namespace {

absl::Status BadSpecPair(const std::string& pair, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("simulation spec: '", pair, "': ", std::string(why)));
}

// The shortest text that reads back as the same double.
std::string ShortestDouble(double v) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, result.ptr);
}

// The test-only token script of a simulated runner (SimulationOptions).
absl::Status LoadScript(const std::string& path, SimulationOptions* o) {
  auto j = ReadJsonFile(path, 16 << 20);
  if (!j.ok()) return j.status();
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("script=", path, ": ", why));
  };
  if (!j->is_object() || !j->contains("replies") || !(*j)["replies"].is_array() ||
      (*j)["replies"].empty()) {
    return bad("expected {\"replies\": [[token ids], ...], \"switch_tokens\": [ids]}");
  }
  for (const nlohmann::json& reply : (*j)["replies"]) {
    if (!reply.is_array()) return bad("each reply must be a list of token ids");
    std::vector<int32_t>& ids = o->script.emplace_back();
    for (const nlohmann::json& t : reply) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= o->vocab) {
        return bad("token ids must be integers in [0, vocab)");
      }
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  if (j->contains("switch_tokens")) {
    if (!(*j)["switch_tokens"].is_array()) return bad("switch_tokens must be a list of ids");
    for (const nlohmann::json& t : (*j)["switch_tokens"]) {
      if (!t.is_number_integer()) return bad("switch_tokens must be a list of ids");
      o->script_switch_tokens.push_back(t.get<int32_t>());
    }
  }
  return absl::OkStatus();
}

runner::SimulatedRunnerOptions ToRunnerOptions(const SimulationOptions& s) {
  runner::SimulatedRunnerOptions r;
  r.vocab_size = s.vocab;
  r.max_position_embeddings = s.context;
  r.prefill_us_per_token = s.prefill_us_per_token;
  r.decode_step_us = s.decode_step_us;
  r.decode_us_per_seq = s.decode_us_per_seq;
  r.fail_after_steps = s.fail_after_steps;
  r.script = s.script;
  r.script_switch_tokens = s.script_switch_tokens;
  return r;
}

}  // namespace

absl::StatusOr<SimulationOptions> ParseSimulationSpec(std::string_view spec) {
  SimulationOptions o;
  absl::flat_hash_set<std::string> seen;
  const std::string text(spec);
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string pair(absl::StripAsciiWhitespace(piece));
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) return BadSpecPair(pair, "expected key=value");
    const std::string key(absl::StripAsciiWhitespace(absl::string_view(pair).substr(0, eq)));
    const absl::string_view value =
        absl::StripAsciiWhitespace(absl::string_view(pair).substr(eq + 1));
    if (!seen.insert(key).second) return BadSpecPair(pair, "key given twice");
    auto integer = [&](int64_t lo, int64_t hi, int64_t* out) -> absl::Status {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadSpecPair(pair, "not an integer");
      if (v < lo || v > hi) {
        return BadSpecPair(pair, absl::StrCat("must be in [", lo, ", ", hi, "]"));
      }
      *out = v;
      return absl::OkStatus();
    };
    auto micros = [&](double* out) -> absl::Status {
      double v = 0;
      if (!absl::SimpleAtod(value, &v)) return BadSpecPair(pair, "not a number");
      if (!std::isfinite(v) || v < 0 || v > 1e9) {
        return BadSpecPair(pair, "must be a number of microseconds in [0, 1e9]");
      }
      *out = v;
      return absl::OkStatus();
    };
    absl::Status status;
    if (key == "vocab") {
      status = integer(runner::SimulatedModelRunner::kMinVocabSize,
                       runner::SimulatedModelRunner::kMaxVocabSize, &o.vocab);
    } else if (key == "context") {
      status = integer(1, model::kMaxPositionEmbeddings, &o.context);
    } else if (key == "prefill_us_per_token") {
      status = micros(&o.prefill_us_per_token);
    } else if (key == "decode_step_us") {
      status = micros(&o.decode_step_us);
    } else if (key == "decode_us_per_seq") {
      status = micros(&o.decode_us_per_seq);
    } else if (key == "kv_bytes_per_token") {
      status = integer(1, int64_t{1} << 40, &o.kv_bytes_per_token);
    } else if (key == "fail_after_steps") {
      status = integer(0, int64_t{1} << 40, &o.fail_after_steps);
    } else if (key == "script") {
      o.script_path = std::string(value);
      status = LoadScript(o.script_path, &o);
    } else {
      status = BadSpecPair(pair,
                           "unknown key; known: vocab, context, prefill_us_per_token, "
                           "decode_step_us, decode_us_per_seq, kv_bytes_per_token, "
                           "fail_after_steps, script");
    }
    if (!status.ok()) return status;
  }
  return o;
}

std::string SimulationSpecString(const SimulationOptions& o) {
  return absl::StrCat("vocab=", o.vocab, ",context=", o.context,
                      ",prefill_us_per_token=", ShortestDouble(o.prefill_us_per_token),
                      ",decode_step_us=", ShortestDouble(o.decode_step_us),
                      ",decode_us_per_seq=", ShortestDouble(o.decode_us_per_seq),
                      ",kv_bytes_per_token=", o.kv_bytes_per_token,
                      ",fail_after_steps=", o.fail_after_steps,
                      o.script_path.empty() ? "" : ",script=", o.script_path);
}

LocalEngine::~LocalEngine() {
  if (engine) engine->Stop();
}

absl::StatusOr<std::unique_ptr<LocalEngine>> BuildLocalEngine(const LocalEngineOptions& o,
                                                              EngineObserver* observer) {
  auto local = std::make_unique<LocalEngine>();
  const int tp = o.tensor_parallel_size;
  if (tp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel_size=", tp, ": must be >= 1"));
  }
  if (tp > 1 && o.simulate) {
    return absl::InvalidArgumentError(
        "--simulate loads no model to shard; use it with --tensor_parallel_size=1");
  }
  // One device per rank (CPU ranks share the host CPU).
  auto devices = kernels::ResolveDevices(o.device, tp);
  if (!devices.ok()) return devices.status();
  local->device = devices->front();
  for (const auto& [flag, value] : o.backends) {
    if (auto s = kernels::ValidateBackendOverride(flag, value); !s.ok()) return s;
  }
  auto report = kernels::BuiltinRegistry().SelectAll(local->device, o.backends);
  if (!report.ok()) return report.status();
  local->backends = *report;
  const bool cuda = local->device.kind == kernels::DeviceKind::kCuda;
  if (cuda && o.simulate) {
    return absl::InvalidArgumentError("--simulate runs no kernels; use it with --device=cpu");
  }
  if (!cuda) {
    auto cpu_kernels = kernels::CpuKernelsFor(*report);
    if (!cpu_kernels.ok()) return cpu_kernels.status();
    local->kernels = std::make_unique<kernels::CpuKernels>(*cpu_kernels);
  }
  std::unique_ptr<runner::ModelRunner> model_runner;
  if (cuda) {
#if TESSERA_HAVE_CUDA
    // In a child process when this binary can run one (preflight_process.h):
    // the preflight's clears would slow this process's decode graphs.
    // Not with a GPU in EXCLUSIVE_PROCESS mode: this process holds its
    // context already (the image probe), so the child could not make one.
    bool child = o.preflight_in_child;
    for (const kernels::DeviceDescription& d : *devices) {
      child &= !(d.gpu.has_value() && d.gpu->exclusive_process);
    }
    const absl::Time preflight_start = absl::Now();
    absl::StatusOr<bool> in_child =
        child ? PreflightInChildProcess(o.device, tp, o.backends) : false;
    if (!in_child.ok()) return in_child.status();
    if (!*in_child) {
      if (auto s = PreflightDevices(*devices, *report); !s.ok()) return s;
    }
    LogInfo("kernel preflight passed",
            {{"process", *in_child ? "child" : "this"},
             {"ms", absl::ToInt64Milliseconds(absl::Now() - preflight_start)}});
    auto model = model::LoadModel(o.model_dir);
    if (!model.ok()) return model.status();
    local->model = std::move(*model);
    if (auto s = model::CheckCudaRunnerSupports(local->model->config); !s.ok()) return s;
    runner::CudaRunnerOptions ro;
    ro.block_size = o.block_size;
    ro.num_kv_blocks = o.kv_cache_blocks;
    ro.gpu_memory_fraction = o.gpu_memory_fraction;
    ro.max_num_seqs = o.max_num_seqs;
    // Room for speculative tokens on top of the scheduler's token budget.
    ro.max_num_tokens = o.max_num_batched_tokens + 8 * o.max_num_seqs;
    ro.cuda_graphs = o.cuda_graphs;
    if (const kernels::Selection* pa = report->Find(kernels::Op::kAttentionPrefill)) {
      ro.prefill_attention_backend = pa->chosen;
    }
    if (tp > 1) {
      if (const kernels::Selection* ar = report->Find(kernels::Op::kAllReduce)) {
        ro.all_reduce_backend = ar->chosen;
      }
      auto runner = parallel::CudaTensorParallelRunner::Create(local->model.get(),
                                                               local->model->config, *devices, ro);
      if (!runner.ok()) return runner.status();
      local->kv_cache_blocks = (*runner)->num_kv_blocks();
      model_runner = std::move(*runner);
    } else {
      auto runner = runner::CudaModelRunner::Create(local->model.get(), local->device, ro);
      if (!runner.ok()) return runner.status();
      local->kv_cache_blocks = (*runner)->num_kv_blocks();
      model_runner = std::move(*runner);
    }
#else
    return absl::FailedPreconditionError("this binary was built without the CUDA backend");
#endif
  } else if (o.simulate) {
    // Nothing runs a kernel: no thread pool, no preflight, no weights.
    local->simulated = true;
    runner::SimulatedRunnerOptions ro = ToRunnerOptions(*o.simulate);
    ro.block_size = o.block_size;
    int64_t blocks = o.kv_cache_blocks;
    if (blocks <= 0) {
      if (o.block_size < 1 || o.simulate->kv_bytes_per_token < 1) {
        return absl::InvalidArgumentError("block_size and kv_bytes_per_token must be >= 1");
      }
      const int64_t bytes_per_block = o.simulate->kv_bytes_per_token * o.block_size;
      blocks = std::max<int64_t>(1, (o.kv_cache_memory_mb << 20) / bytes_per_block);
    }
    ro.num_kv_blocks = blocks;
    local->kv_cache_blocks = blocks;
    auto runner = runner::SimulatedModelRunner::Create(ro);
    if (!runner.ok()) return runner.status();
    model_runner = std::move(*runner);
  } else {
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
    if (auto s = parallel::CheckTensorParallel(config, tp); !s.ok()) return s;
    int64_t blocks = o.kv_cache_blocks;
    if (blocks <= 0) {
      // The budget covers every rank's cache (KV heads replicated when
      // there are fewer than the ranks).
      // MLA: one latent row per token and layer (model/kv_cache_size.h).
      const int64_t kv_heads = tp * parallel::KvHeadsPerRank(config, tp);
      const int64_t bytes_per_block =
          config.mla ? model::KvCacheBytesPerToken(config, sizeof(float)) * o.block_size
                     : int64_t{2} * config.num_hidden_layers * kv_heads * config.head_dim *
                           o.block_size * static_cast<int64_t>(sizeof(float));
      blocks = std::max<int64_t>(1, (o.kv_cache_memory_mb << 20) / bytes_per_block);
    }
    ro.num_kv_blocks = blocks;
    local->kv_cache_blocks = blocks;
    if (tp == 1) {
      auto runner = runner::CpuModelRunner::Create(local->model.get(), ro);
      if (!runner.ok()) return runner.status();
      model_runner = std::move(*runner);
    } else {
      parallel::TensorParallelOptions tpo;
      tpo.tensor_parallel_size = tp;
      auto moe_mode = parallel::ParseMoeParallelism(o.moe_parallel);
      if (!moe_mode.ok()) return moe_mode.status();
      tpo.moe_parallelism = *moe_mode;
      ro.num_threads = o.cpu_threads > 0 ? std::max(1, o.cpu_threads / tp) : 0;
      tpo.rank = ro;
      auto runner = parallel::TensorParallelRunner::Create(local->model.get(), tpo);
      if (!runner.ok()) return runner.status();
      LogInfo("tensor parallelism on CPU ranks",
              {{"ranks", tp},
               {"all_reduce", local->kernels->BackendOf(kernels::Op::kAllReduce)},
               {"moe_parallel", o.moe_parallel}});
      model_runner = std::move(*runner);
    }
  }
  const model::ModelConfig& config = model_runner->config();

  EngineOptions eo;
  eo.scheduler.max_num_seqs = o.max_num_seqs;
  eo.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  eo.scheduler.max_model_len =
      o.max_model_len > 0 ? o.max_model_len : static_cast<int>(config.max_position_embeddings);
  eo.scheduler.enable_prefix_caching = o.enable_prefix_caching;
  eo.max_waiting = o.max_waiting;
  eo.speculation = o.speculation;
  eo.draft_provider = o.draft_provider;
  for (int64_t id : config.eos_token_ids) eo.eos_token_ids.push_back(static_cast<TokenId>(id));
  if (auto s = model::CheckContextLength(config, eo.scheduler.max_model_len); !s.ok()) return s;
  auto engine = Engine::Create(std::move(model_runner), eo, observer);
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
