// gpu_tp_bench: tensor-parallel decode on the GPUs of one host — Llama-3-8B
// shapes, random bf16 weights — at TP=1 and TP=2 (and more when the host has
// the GPUs) in one run, with the cost of the all-reduces; "2s" in
// --tp_sizes is one TP=2 rank's shard alone on one GPU (no collectives).
//
// Each configuration runs in a child process of its own (this binary with
// --only_config), as a worker runs its one runner: in one process every
// runner after the first ran slower on the H200 (batch 64, graph step:
// TP=1 5.20 ms first, 5.30 and 5.33 after; a TP=2 rank's shard 3.02 first,
// 3.14 and 3.13 after; the extra time is gaps between kernels), which
// favoured whichever configuration ran first. --process_per_config=false
// runs them all in this process. Before its runner, each configuration runs
// the worker's kernel preflight on its devices as tessera-worker does: by
// default in a child process (--preflight=2, worker/engine/preflight_process.h);
// --preflight=1 runs it in the runner's process, as the worker did, which made
// its decode steps 2-4% slower on the H200 (some 40 small cudaMemset calls
// before the graphs exist do it: tests/bench/results/preflight_process_h200.json).
//
// Per TP size and batch: B prompts of --prompt_len random tokens prefilled,
// then --decode_steps greedy steps (CUDA graphs; the ranks' argmax combined on
// the host). Reported: decode tok/s, speedup over TP=1, and the NCCL
// all-reduce of one decode step's activation (hidden x batch bf16) timed
// alone, eager and inside a CUDA graph, times the all-reduces per step
// (2 per layer + 1 for the embedding).
// With --kernel_trace_steps=N, N more steps per row run under a CUPTI
// kernel trace and the row gets their per-kernel breakdown ("kernel_trace");
// tracing slows launches, so take throughput from a run without it.
// graph_ms_per_step: the last step's graphs replayed back to back on every
// rank (no host work, no argmax); host_ms_per_step: the step time minus that.
// first_step_ms: the batch's first decode step (eager, with GEMM autotuning
// when on, then its graph's capture); second_step_ms: the next, which only
// captures the other context bucket's graph. Their difference between
// --gemm_autotune=0 and 1 rows is what tuning adds to a worker's start-up.
// With --sample_steps=N: sampled_step_ms_on_gpu / _on_host, N decode steps
// drawing with temperature 1 and top-p 0.9 through ForwardSample (logits
// stay on the GPUs) or through Forward and the host sampler (the logits
// copied to the host), the wall time per step.
// Usage: gpu_tp_bench [--tp_sizes=1,2] [--batch_sizes=1,64] [--out=f.json]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"
#include "nlohmann/json.hpp"
#include "tests/bench/cuda_runner_bench_peer.h"
#include "tests/bench/kernel_trace.h"
#include "tests/bench/llama3_8b_config.h"
#include "tests/bench/random_cuda_weights.h"
#include "worker/engine/preflight_process.h"
#include "worker/model/config.h"
#include "worker/parallel/cuda_tensor_parallel_runner.h"
#include "worker/runner/cuda/cuda_preflight.h"
#include "worker/sampling/sampler.h"

ABSL_FLAG(std::vector<std::string>, tp_sizes, std::vector<std::string>({"1", "2"}),
          "TP sizes; \"Ns\" runs one rank's shard of TP=N alone on one GPU (1/N of the heads, "
          "KV heads, MLP and vocabulary; no collectives): what TP=N would take if its "
          "all-reduces and the waits between the ranks cost nothing");
ABSL_FLAG(std::vector<std::string>, batch_sizes, std::vector<std::string>({"1", "64"}),
          "decode batch sizes");
ABSL_FLAG(std::vector<std::string>, all_reduce_backends, std::vector<std::string>({"nccl", "p2p"}),
          "all-reduce backends to run each TP > 1 size with");
ABSL_FLAG(std::vector<std::string>, gemm_autotune, std::vector<std::string>({"1"}),
          "GEMM autotuning to run every configuration with, in order (repeat values to "
          "alternate): 0 off, 1 on (CudaRunnerOptions::gemm_autotune) with the default "
          "number of candidates, N > 1 on with N candidates per shape "
          "(gemm_autotune_candidates)");
ABSL_FLAG(int, sample_steps, 0,
          "if > 0, this many more decode steps per row drawing every token with "
          "temperature 1, top-p 0.9 on the GPUs (ForwardSample) and as many with the "
          "logits copied to the host and sampled there (Forward + worker/sampling), "
          "timed separately");
ABSL_FLAG(int, prompt_len, 128, "prompt tokens per sequence");
ABSL_FLAG(int, decode_steps, 64, "decode steps timed");
ABSL_FLAG(int, kernel_trace_steps, 0,
          "if > 0, this many more steps per row under a CUPTI kernel trace, summarized per "
          "device and kernel in the row");
ABSL_FLAG(std::string, out, "", "write the JSON here too");
ABSL_FLAG(bool, process_per_config, true,
          "run each configuration (TP size or shard, backend, autotune, preflight) in a "
          "process of its own, as a worker runs its one runner; false: all in this process, "
          "one after another (every runner after a process's first ran 2-4% slower on the "
          "H200)");
ABSL_FLAG(std::vector<std::string>, preflight, std::vector<std::string>({"2"}),
          "values (0/1/2) to run every configuration with: 2 runs the worker's kernel preflight "
          "for the runner's devices in a child process, as tessera-worker does "
          "(worker/engine/preflight_process.h); 1 runs it in the runner's process before the "
          "runner (runner::PreflightCudaKernels), as tessera-worker did: its clears of its "
          "buffers made every later graph step slower on the H200 (about 0.5 us more between "
          "kernels); 0: none");
ABSL_FLAG(std::vector<std::string>, preflight_ops, {},
          "with --preflight: only the checks of these ops (kernels/op.h names); empty: all");
ABSL_FLAG(int, only_config, -1, "run only configuration N of the list (set by the parent)");

namespace tessera {
namespace {

namespace kcu = ::tessera::kernels::cuda;

#define CHECK_OR_DIE(expr)                                            \
  do {                                                                \
    absl::Status s_ = (expr);                                         \
    if (!s_.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.ToString().c_str()); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

struct AllReduceTimes {
  double nccl_eager_us = 0, nccl_graph_us = 0;
  double p2p_eager_us = 0, p2p_graph_us = 0;
  // The fused all-reduce + residual add + RMSNorm (one kernel), in a graph.
  double p2p_add_norm_graph_us = 0;
  bool p2p_correct = false;  // the sum of the ranks' known values, on every element
  std::string p2p_error;     // why no P2P figures (e.g. no peer access)
};

// Microseconds per all-reduce of `count` bf16 values over the devices, NCCL
// and the one-shot peer-to-peer kernel, eager and inside a CUDA graph.
AllReduceTimes TimeAllReduce(const std::vector<kernels::DeviceDescription>& devices, int64_t count,
                             int64_t hidden) {
  const int n = static_cast<int>(devices.size());
  std::vector<int> ordinals;
  for (const auto& d : devices) ordinals.push_back(d.ordinal);
  auto group = kcu::NcclGroup::Create(ordinals);
  CHECK_OR_DIE(group.status());
  AllReduceTimes times;
  auto p2p = kcu::P2pAllReduce::Create(ordinals, count);
  if (!p2p.ok()) times.p2p_error = std::string(p2p.status().message());
  std::vector<int> p2p_ok(n, 0);
  constexpr int kEager = 500, kPerGraph = 64, kGraphs = 20;
  double eager_us = 0, graph_us = 0;
  absl::Barrier* start = new absl::Barrier(n);
  absl::Barrier* p2p_start = new absl::Barrier(n);
  absl::Barrier* p2p_mid = new absl::Barrier(n);
  absl::Barrier* p2p_fused = new absl::Barrier(n);
  absl::Barrier* mid = new absl::Barrier(n);
  absl::Barrier* end = new absl::Barrier(n);
  auto rank_fn = [&](int r) {
    CHECK_OR_DIE(kcu::SetDevice(ordinals[r]));
    auto stream = kcu::Stream::Create();
    CHECK_OR_DIE(stream.status());
    auto buf = kcu::DeviceBuffer::Allocate(count * 2);
    CHECK_OR_DIE(buf.status());
    CHECK_OR_DIE(kcu::MemsetDevice(buf->data(), 0, count * 2));
    for (int i = 0; i < 20; ++i) {  // warm-up (connection set-up)
      CHECK_OR_DIE((*group)->AllReduceSum(r, buf->data(), count, kcu::NcclGroup::DType::kBf16,
                                          stream->get()));
    }
    CHECK_OR_DIE(kcu::Synchronize(stream->get()));
    kcu::CudaGraph graph;
    CHECK_OR_DIE(graph.BeginCapture(stream->get()));
    for (int i = 0; i < kPerGraph; ++i) {
      CHECK_OR_DIE((*group)->AllReduceSum(r, buf->data(), count, kcu::NcclGroup::DType::kBf16,
                                          stream->get()));
    }
    CHECK_OR_DIE(graph.EndCapture());
    if (start->Block()) delete start;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kEager; ++i) {
      CHECK_OR_DIE((*group)->AllReduceSum(r, buf->data(), count, kcu::NcclGroup::DType::kBf16,
                                          stream->get()));
    }
    CHECK_OR_DIE(kcu::Synchronize(stream->get()));
    auto t1 = std::chrono::steady_clock::now();
    if (mid->Block()) delete mid;
    auto t2 = std::chrono::steady_clock::now();
    for (int i = 0; i < kGraphs; ++i) CHECK_OR_DIE(graph.Launch(stream->get()));
    CHECK_OR_DIE(kcu::Synchronize(stream->get()));
    auto t3 = std::chrono::steady_clock::now();
    if (r == 0) {
      eager_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kEager;
      graph_us = std::chrono::duration<double, std::micro>(t3 - t2).count() / (kGraphs * kPerGraph);
    }
    // The peer-to-peer kernel: a correctness check with known values, then
    // the same eager and graph timings.
    if (p2p.ok()) {
      std::vector<kcu::Bf16> host(count, kcu::FloatToBf16(static_cast<float>(r + 1)));
      CHECK_OR_DIE(kcu::CopyToDevice(buf->data(), host.data(), count * 2, stream->get()));
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      if (p2p_start->Block()) delete p2p_start;
      CHECK_OR_DIE((*p2p)->AllReduceSumBf16(r, buf->as<kcu::Bf16>(), count, stream->get()));
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      CHECK_OR_DIE(kcu::CopyToHost(host.data(), buf->data(), count * 2, stream->get()));
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      const float want = static_cast<float>(n * (n + 1) / 2);
      bool ok = true;
      for (kcu::Bf16 v : host) ok &= kcu::Bf16ToFloat(v) == want;
      p2p_ok[r] = ok ? 1 : 0;
      kcu::CudaGraph p2p_graph;
      CHECK_OR_DIE(p2p_graph.BeginCapture(stream->get()));
      for (int i = 0; i < kPerGraph; ++i) {
        CHECK_OR_DIE((*p2p)->AllReduceSumBf16(r, buf->as<kcu::Bf16>(), count, stream->get()));
      }
      CHECK_OR_DIE(p2p_graph.EndCapture());
      if (p2p_mid->Block()) delete p2p_mid;
      auto u0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kEager; ++i) {
        CHECK_OR_DIE((*p2p)->AllReduceSumBf16(r, buf->as<kcu::Bf16>(), count, stream->get()));
      }
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      auto u1 = std::chrono::steady_clock::now();
      for (int i = 0; i < kGraphs; ++i) CHECK_OR_DIE(p2p_graph.Launch(stream->get()));
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      auto u2 = std::chrono::steady_clock::now();
      if (r == 0) {
        times.p2p_eager_us = std::chrono::duration<double, std::micro>(u1 - u0).count() / kEager;
        times.p2p_graph_us =
            std::chrono::duration<double, std::micro>(u2 - u1).count() / (kGraphs * kPerGraph);
      }
      // The same message as rows of the hidden size through the fused
      // all-reduce + residual add + RMSNorm, as a decoder layer runs it.
      auto residual = kcu::DeviceBuffer::Allocate(count * 4);
      auto norm_w = kcu::DeviceBuffer::Allocate(hidden * 4);
      auto normed = kcu::DeviceBuffer::Allocate(count * 2);
      CHECK_OR_DIE(residual.status());
      CHECK_OR_DIE(norm_w.status());
      CHECK_OR_DIE(normed.status());
      CHECK_OR_DIE(kcu::MemsetDevice(residual->data(), 0, count * 4));
      CHECK_OR_DIE(kcu::MemsetDevice(norm_w->data(), 0, hidden * 4));
      kcu::CudaGraph fused_graph;
      CHECK_OR_DIE(fused_graph.BeginCapture(stream->get()));
      for (int i = 0; i < kPerGraph; ++i) {
        CHECK_OR_DIE((*p2p)->AllReduceAddRmsNorm(r, buf->as<kcu::Bf16>(), residual->as<float>(),
                                                 count / hidden, hidden, norm_w->as<float>(), 1e-5f,
                                                 normed->as<kcu::Bf16>(), stream->get()));
      }
      CHECK_OR_DIE(fused_graph.EndCapture());
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      if (p2p_fused->Block()) delete p2p_fused;
      auto f0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kGraphs; ++i) CHECK_OR_DIE(fused_graph.Launch(stream->get()));
      CHECK_OR_DIE(kcu::Synchronize(stream->get()));
      auto f1 = std::chrono::steady_clock::now();
      if (r == 0) {
        times.p2p_add_norm_graph_us =
            std::chrono::duration<double, std::micro>(f1 - f0).count() / (kGraphs * kPerGraph);
      }
    }
    if (end->Block()) delete end;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank_fn, r);
  for (auto& t : threads) t.join();
  times.nccl_eager_us = eager_us;
  times.nccl_graph_us = graph_us;
  times.p2p_correct = p2p.ok();
  for (int ok : p2p_ok) times.p2p_correct &= ok == 1;
  if (p2p.ok()) {
    for (int r = 0; r < n; ++r) {
      auto t = (*p2p)->Timeouts(r);
      if (!t.ok() || *t != 0) times.p2p_correct = false;
    }
  }
  return times;
}

// The worker's kernel preflight on `d` (its checks of --preflight_ops only,
// when given).
void PreflightAsWorker(const kernels::DeviceDescription& d) {
  auto report = kernels::BuiltinRegistry().SelectAll(d);
  CHECK_OR_DIE(report.status());
  const std::vector<std::string> only_ops = absl::GetFlag(FLAGS_preflight_ops);
  for (kernels::Selection& sel : report->selections) {
    if (!only_ops.empty() &&
        std::find(only_ops.begin(), only_ops.end(), kernels::OpName(sel.op)) == only_ops.end()) {
      sel.chosen = "none";  // its check does not run
    }
  }
  CHECK_OR_DIE(runner::PreflightCudaKernels(d, *report));
}

// The command line, for the children of --process_per_config.
std::vector<std::string> g_args;

// Each row's speedup_vs_tp1: its tok/s over the TP=1 row (whole model) of
// the same batch, autotune and preflight setting, when there is one.
void SetSpeedups(nlohmann::json& results) {
  auto key = [](const nlohmann::json& r) {
    return std::make_tuple(r["batch"].get<int>(), r["gemm_autotune"].get<bool>(),
                           r["preflight"].get<bool>(), r.value("preflight_in_child", false));
  };
  std::map<std::tuple<int, bool, bool, bool>, double> tp1;
  for (const auto& r : results) {
    if (r["tp"] == 1 && r["shard_of_tp"] == 1) {
      tp1[key(r)] = r["decode_tokens_per_second"].get<double>();
    }
  }
  for (auto& r : results) {
    auto it = tp1.find(key(r));
    r["speedup_vs_tp1"] =
        it != tp1.end() ? r["decode_tokens_per_second"].get<double>() / it->second : 0.0;
  }
}

// Runs configuration `index` in a child process (this binary with
// --only_config) and returns its JSON output.
nlohmann::json RunChild(int index) {
  const std::string out = absl::StrCat("/tmp/gpu_tp_bench.", getpid(), ".", index, ".json");
  std::vector<std::string> args = g_args;
  args.push_back(absl::StrCat("--only_config=", index));
  args.push_back("--out=" + out);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) CHECK_OR_DIE(absl::InternalError("fork failed"));
  if (pid == 0) {
    FILE* null = std::fopen("/dev/null", "w");  // the JSON goes to --out
    if (null != nullptr) dup2(fileno(null), STDOUT_FILENO);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    CHECK_OR_DIE(absl::InternalError(
        absl::StrCat("configuration ", index, " failed (wait status ", status, ")")));
  }
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in);
  std::remove(out.c_str());
  return j;
}

// Sizes every configuration shares, from the flags.
struct BenchShape {
  int prompt_len = 0;
  int steps = 0;  // decode steps timed
  int block = 16;
  int blocks_per_seq = 0;
  int max_batch = 1;
  std::vector<int> batches;
};

BenchShape ReadShape() {
  BenchShape s;
  s.prompt_len = absl::GetFlag(FLAGS_prompt_len);
  s.steps = absl::GetFlag(FLAGS_decode_steps);
  for (const auto& b : absl::GetFlag(FLAGS_batch_sizes)) s.batches.push_back(std::stoi(b));
  for (int b : s.batches) s.max_batch = std::max(s.max_batch, b);
  s.blocks_per_seq = (s.prompt_len + s.steps + 1 + s.block - 1) / s.block;
  return s;
}

// One configuration: TP size, all-reduce backend, GEMM autotune, shard,
// preflight.
struct Config {
  int tp;
  std::string backend;
  int autotune;
  int shard_of = 1;  // > 1: one rank's shard of TP=shard_of, alone (tp is 1)
  int preflight = 1;
};

// In run order: TP=1 and shards once per preflight and autotune value,
// larger groups once per backend and values.
std::vector<Config> ListConfigs() {
  std::vector<Config> configs;
  for (const auto& preflight_text : absl::GetFlag(FLAGS_preflight)) {
    const int preflight = std::stoi(preflight_text);
    for (const auto& tune_text : absl::GetFlag(FLAGS_gemm_autotune)) {
      const int tune = std::stoi(tune_text);
      for (const auto& tp_text : absl::GetFlag(FLAGS_tp_sizes)) {
        const int tp = std::stoi(tp_text);
        if (tp_text.back() == 's') {
          configs.push_back({1, "none", tune, tp, preflight});
          continue;
        }
        if (tp == 1) {
          configs.push_back({1, "none", tune, 1, preflight});
          continue;
        }
        for (const auto& b : absl::GetFlag(FLAGS_all_reduce_backends))
          configs.push_back({tp, b, tune, 1, preflight});
      }
    }
  }
  return configs;
}

void WriteJson(const nlohmann::json& out) {
  std::printf("%s\n", out.dump(2).c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << out.dump(2);
}

// The runner of configuration `c` on `devices`, after what comes before a
// runner in its process (the preflight, in it or in a child); *o gets its
// options.
std::unique_ptr<parallel::CudaTensorParallelRunner> MakeRunner(
    const Config& c, const model::ModelConfig& shape,
    const std::vector<kernels::DeviceDescription>& devices, const BenchShape& s,
    runner::CudaRunnerOptions* o) {
  if (c.tp > 1) o->all_reduce_backend = c.backend;
  o->gemm_autotune = c.autotune != 0;
  if (c.autotune > 1) o->gemm_autotune_candidates = c.autotune;
  o->block_size = s.block;
  o->num_kv_blocks = int64_t{s.max_batch} * s.blocks_per_seq + 16;
  o->max_num_seqs = s.max_batch;
  o->max_num_tokens = std::max(s.max_batch * s.prompt_len, 256);
  for (const kernels::DeviceDescription& d : devices) {
    if (c.preflight == 1) PreflightAsWorker(d);
    if (c.preflight == 2) {
      auto in_child =
          engine::PreflightInChildProcess(absl::StrCat("cuda:", d.gpu->pci_bus_id), 1, {});
      CHECK_OR_DIE(in_child.status());
      if (!*in_child) CHECK_OR_DIE(absl::InternalError("the preflight child gave no result"));
    }
  }
  auto runner = parallel::CudaTensorParallelRunner::Create(nullptr, shape, devices, *o,
                                                           bench::RandomCudaWeights(99));
  CHECK_OR_DIE(runner.status());
  return std::move(*runner);
}

// One batch of sequences on a runner: their block tables and the tokens
// their prefill gave.
struct BatchRun {
  parallel::CudaTensorParallelRunner* runner = nullptr;
  const BenchShape* shape = nullptr;
  int batch = 0;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> first;  // the prefill's tokens
  std::vector<int32_t> next;   // the last step's tokens

  // One greedy decode step of every sequence at position `pos`.
  void Step(int pos) {
    runner::ForwardBatch d;
    d.block_table_stride = shape->blocks_per_seq;
    for (int s = 0; s < batch; ++s) d.AddSequence({next[s]}, pos, tables[s], shape->block, true);
    CHECK_OR_DIE(runner->ForwardGreedy(d, &next));
  }
};

// `batch` prompts of random tokens prefilled in one step.
BatchRun Prefill(parallel::CudaTensorParallelRunner* runner, const BenchShape& shape, int batch,
                 int64_t vocab, std::mt19937& rng) {
  BatchRun run{runner, &shape, batch, std::vector<std::vector<int32_t>>(batch)};
  runner::ForwardBatch prefill;
  prefill.block_table_stride = shape.blocks_per_seq;
  for (int s = 0; s < batch; ++s) {
    for (int j = 0; j < shape.blocks_per_seq; ++j) {
      run.tables[s].push_back(s * shape.blocks_per_seq + j);
    }
    std::vector<int32_t> prompt(shape.prompt_len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
    prefill.AddSequence(prompt, 0, run.tables[s], shape.block, true);
  }
  CHECK_OR_DIE(runner->ForwardGreedy(prefill, &run.next));
  run.first = run.next;
  return run;
}

// Milliseconds per sampled decode step (temperature 1, top-p 0.9) from the
// prefill's state: on the GPUs (ForwardSample) or with the logits copied to
// the host and sampled there (Forward + worker/sampling).
double SampledStepMs(BatchRun& run, bool on_device, int64_t vocab, int sample_steps) {
  const int batch = run.batch, prompt_len = run.shape->prompt_len;
  std::vector<runner::DeviceSamplingRow> rows(batch);
  for (int s = 0; s < batch; ++s) {
    rows[s].temperature = 1.0f;
    rows[s].top_p = 0.9f;
    rows[s].seed = 1000 + s;
  }
  std::vector<float> logits;
  run.next = run.first;
  auto c0 = std::chrono::steady_clock::now();
  for (int i = 0; i <= sample_steps; ++i) {  // step 0: set-up (buffers), not timed
    if (i == 1) c0 = std::chrono::steady_clock::now();
    runner::ForwardBatch d;
    d.block_table_stride = run.shape->blocks_per_seq;
    for (int q = 0; q < batch; ++q) {
      d.AddSequence({run.next[q]}, prompt_len + i, run.tables[q], run.shape->block, true);
      rows[q].position = prompt_len + i + 1;
    }
    if (on_device) {
      CHECK_OR_DIE(run.runner->ForwardSample(d, rows, &run.next));
      continue;
    }
    CHECK_OR_DIE(run.runner->Forward(d, &logits));
    for (int q = 0; q < batch; ++q) {
      sampling::SamplingParams p;
      p.temperature = rows[q].temperature;
      p.top_p = rows[q].top_p;
      p.seed = rows[q].seed;
      auto drawn = sampling::Sample(absl::MakeConstSpan(logits.data() + q * vocab, vocab), p,
                                    sampling::TokenCounts{}, rows[q].position);
      CHECK_OR_DIE(drawn.status());
      run.next[q] = drawn->token;
    }
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count() /
         sample_steps;
}

// `trace_steps` decode steps under the CUPTI kernel trace, summarized.
nlohmann::json TraceKernels(BatchRun& run, int trace_steps) {
  const int prompt_len = run.shape->prompt_len;
  run.next = run.first;
  run.Step(prompt_len);  // the step before the window has drained when ForwardGreedy returns
  const uint64_t begin = bench::KernelTrace::Now();
  for (int i = 1; i <= trace_steps; ++i) run.Step(prompt_len + i);
  auto records = bench::KernelTrace::Collect(begin, bench::KernelTrace::Now());
  CHECK_OR_DIE(records.status());
  return bench::SummarizeKernels(*records, trace_steps);
}

// The row of configuration `c` at batch size `batch`.
nlohmann::json TimeBatch(parallel::CudaTensorParallelRunner* runner, const Config& c,
                         const runner::CudaRunnerOptions& o, const model::ModelConfig& config,
                         const model::ModelConfig& shape,
                         const std::vector<kernels::DeviceDescription>& devices,
                         const BenchShape& s, int batch, std::mt19937& rng,
                         std::set<std::pair<int, int>>* timed) {
  const int trace_steps = absl::GetFlag(FLAGS_kernel_trace_steps);
  const int sample_steps = absl::GetFlag(FLAGS_sample_steps);
  const int prompt_len = s.prompt_len, steps = s.steps, tp = c.tp;
  BatchRun run = Prefill(runner, s, batch, shape.vocab_size, rng);
  // The batch's first decode steps: the first runs eagerly (GEMM
  // autotuning, when on, times its shapes there) and then captures its
  // graph; the second captures the other context bucket's graph.
  std::vector<double> setup_ms;
  for (int pos : {prompt_len + steps, prompt_len}) {  // capture both context buckets
    run.next = run.first;
    const auto c0 = std::chrono::steady_clock::now();
    run.Step(pos);
    setup_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= steps; ++i) run.Step(prompt_len + i);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tps = batch * steps / sec;
  // The same step's graph replayed back to back: the GPUs' share.
  auto graph_ms = bench::CudaRunnerBenchPeer::ReplayLastDecodeGraphMs(*runner, steps);
  CHECK_OR_DIE(graph_ms.status());
  // Sampled decode, on the GPUs and on the host, from the same state.
  double device_sample_ms = 0, host_sample_ms = 0;
  if (sample_steps > 0) {
    device_sample_ms = SampledStepMs(run, true, shape.vocab_size, sample_steps);
    host_sample_ms = SampledStepMs(run, false, shape.vocab_size, sample_steps);
  }
  nlohmann::json trace;
  if (trace_steps > 0) trace = TraceKernels(run, trace_steps);
  // The collectives alone, once per (TP, batch).
  const bool time_collectives = tp > 1 && timed->insert({tp, batch}).second;
  const AllReduceTimes ar =
      time_collectives
          ? TimeAllReduce(devices, int64_t{batch} * config.hidden_size, config.hidden_size)
          : AllReduceTimes{};
  const double eager_us = ar.nccl_eager_us, graph_us = ar.nccl_graph_us;
  const int reduces_per_step = 2 * static_cast<int>(config.num_hidden_layers) + 1;
  nlohmann::json r = {
      {"tp", tp},
      {"shard_of_tp", c.shard_of},
      {"preflight", c.preflight != 0},
      {"preflight_in_child", c.preflight == 2},
      {"all_reduce_backend", c.backend},
      {"batch", batch},
      {"decode_ms_per_step", 1e3 * sec / steps},
      {"graph_ms_per_step", *graph_ms},
      {"host_ms_per_step", 1e3 * sec / steps - *graph_ms},
      {"decode_tokens_per_second", tps},
      {"sampled_step_ms_on_gpu", device_sample_ms},
      {"sampled_step_ms_on_host", host_sample_ms},
      {"first_step_ms", setup_ms[0]},
      {"second_step_ms", setup_ms[1]},
      {"gemm_autotune", c.autotune != 0},
      {"gemm_autotune_candidates", c.autotune > 1 ? c.autotune : o.gemm_autotune_candidates},
      {"speedup_vs_tp1", 0.0},  // SetSpeedups
      {"all_reduce_bytes", int64_t{batch} * config.hidden_size * 2},
      {"all_reduce_us_eager", eager_us},
      {"all_reduce_us_in_graph", graph_us},
      {"all_reduces_per_step", tp > 1 ? reduces_per_step : 0},
      {"all_reduce_ms_per_step_in_graph", tp > 1 ? reduces_per_step * graph_us / 1e3 : 0.0},
      {"p2p_all_reduce_us_eager", ar.p2p_eager_us},
      {"p2p_all_reduce_us_in_graph", ar.p2p_graph_us},
      {"p2p_all_reduce_add_rmsnorm_us_in_graph", ar.p2p_add_norm_graph_us},
      {"p2p_all_reduce_correct", ar.p2p_correct},
      {"p2p_error", ar.p2p_error},
  };
  if (trace_steps > 0) r["kernel_trace"] = trace;
  std::fprintf(stderr, "%s\n", r.dump().c_str());
  return r;
}

// Configuration `c`'s rows, one per batch size, appended to *results
// (none when the host has fewer GPUs than it needs).
void RunConfig(const Config& c, const model::ModelConfig& config,
               const std::vector<kernels::DeviceDescription>& found, const BenchShape& s,
               std::set<std::pair<int, int>>* timed, nlohmann::json* results) {
  // One rank's shapes of TP=shard_of (worker/parallel's sharding: heads,
  // KV heads, MLP and vocabulary divided; the hidden size whole).
  model::ModelConfig shape = config;
  shape.num_attention_heads /= c.shard_of;
  shape.num_key_value_heads /= c.shard_of;
  shape.intermediate_size /= c.shard_of;
  shape.vocab_size /= c.shard_of;
  if (c.tp > static_cast<int>(found.size())) {
    std::fprintf(stderr, "TP=%d skipped: %zu GPUs visible\n", c.tp, found.size());
    return;
  }
  std::vector<kernels::DeviceDescription> devices(found.begin(), found.begin() + c.tp);
  runner::CudaRunnerOptions o;
  std::unique_ptr<parallel::CudaTensorParallelRunner> runner = MakeRunner(c, shape, devices, s, &o);
  std::mt19937 rng(5);
  for (int batch : s.batches) {
    results->push_back(TimeBatch(runner.get(), c, o, config, shape, devices, s, batch, rng, timed));
  }
}

int Run() {
  auto config = model::ParseModelConfig(kLlama3_8BConfig, "llama3_8b");
  CHECK_OR_DIE(config.status());
  const BenchShape s = ReadShape();
  const std::vector<Config> configs = ListConfigs();
  nlohmann::json results = nlohmann::json::array();
  const int only = absl::GetFlag(FLAGS_only_config);
  nlohmann::json out = {{"benchmark", "gpu_tp_bench"},
                        {"model", "Llama-3-8B shapes, random bf16 weights"},
                        {"prompt_len", s.prompt_len},
                        {"decode_steps", s.steps},
                        {"process_per_config", absl::GetFlag(FLAGS_process_per_config)}};
  if (absl::GetFlag(FLAGS_process_per_config) && only < 0 && configs.size() > 1) {
    // This process only starts the children (no CUDA context of its own).
    for (size_t i = 0; i < configs.size(); ++i) {
      nlohmann::json child = RunChild(static_cast<int>(i));
      for (const char* key : {"nccl", "gpus", "device"}) out[key] = child[key];
      for (auto& r : child["results"]) results.push_back(r);
    }
    SetSpeedups(results);
    out["results"] = results;
    WriteJson(out);
    return 0;
  }
  if (only >= static_cast<int>(configs.size())) {
    CHECK_OR_DIE(absl::InvalidArgumentError(
        absl::StrCat("--only_config=", only, ": ", configs.size(), " configurations")));
  }
  if (absl::GetFlag(FLAGS_kernel_trace_steps) > 0) {
    CHECK_OR_DIE(bench::KernelTrace::Enable());  // before any graph exists
  }
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  std::set<std::pair<int, int>> timed;  // (TP, batch) whose collectives were timed
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    if (only >= 0 && static_cast<int>(ci) != only) continue;
    RunConfig(configs[ci], *config, found.devices, s, &timed, &results);
  }
  SetSpeedups(results);
  out["nccl"] = kcu::NcclGroup::Version();
  out["gpus"] = found.devices.size();
  out["device"] = found.devices.empty() ? "" : found.devices[0].Summary();
  out["results"] = results;
  WriteJson(out);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  // --preflight=2's child (worker/engine/preflight_process.h).
  if (int rc = tessera::engine::RunPreflightChildIfAsked(argc, argv); rc >= 0) return rc;
  tessera::g_args.assign(argv, argv + argc);
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
