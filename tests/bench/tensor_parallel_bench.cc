// Tensor parallelism on CPU ranks, measured in one run on this machine:
//   1. InProcessGroup::AllReduceSum latency for N = 2 and 4 ranks over message
//      sizes from one decode token's hidden state to a prefill's;
//   2. decode step time (batch 1 and 8) of a random bf16 Qwen3-shaped model
//      with TP = 1, 2 and 4, the same total CPU threads split among the ranks,
//      with the all-reduce time per step estimated from (1) at the step's size.
// CPU TP does not add memory bandwidth or cores, so it is not expected to be
// faster than TP=1 here; the point is its overhead (barriers, partial sums)
// next to the same work on one rank, and the all-reduce cost a step pays.
//
// The JSON records the 1-minute load average before and after: on a shared
// machine other processes' load changes the figures more than TP does.
//
// Usage: tensor_parallel_bench [--out=FILE] [--steps=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu_backend.h"
#include "tests/bench/bench_util.h"
#include "worker/parallel/in_process_group.h"
#include "worker/parallel/tensor_parallel_runner.h"
#include "worker/runner/cpu_model_runner.h"

ABSL_FLAG(std::string, out, "tests/bench/results/tensor_parallel_cpu.json", "result JSON");
ABSL_FLAG(int, steps, 32, "decode steps timed per configuration");

namespace tp = tessera::parallel;
namespace kc = tessera::kernels::cpu;
using Clock = std::chrono::steady_clock;

// Median microseconds of one AllReduceSum of n floats on `ranks` threads.
double AllReduceMicros(int ranks, int64_t n, int iters) {
  tp::InProcessGroup group(ranks, tessera::kernels::OptimizedCpuKernels().reduce_sum);
  std::vector<std::vector<float>> bufs(ranks, std::vector<float>(n, 1.0f));
  std::vector<double> times(iters);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      kc::CpuContext ctx;  // the rank's own thread only
      for (int i = 0; i < iters; ++i) {
        auto start = Clock::now();
        group.rank(r)->AllReduceSum(ctx, bufs[r].data(), n);
        if (r == 0)
          times[i] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::sort(times.begin(), times.end());
  return times[iters / 2];
}

// The 1-minute load average (/proc/loadavg), or -1.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return in ? load : -1;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int cores = kc::ThreadPool::DefaultThreadCount();
  nlohmann::json result;
  result["load_average_1min_before"] = LoadAverage();
  result["what"] =
      "CPU tensor parallelism: in-process all-reduce latency, and decode step time TP=1 vs 2 vs 4 "
      "with the same total threads";
  result["cpu_threads"] = cores;

  nlohmann::json ar = nlohmann::json::array();
  for (int ranks : {2, 4}) {
    for (int64_t n : {int64_t{1024}, int64_t{8} * 1024, int64_t{64} * 1024, int64_t{1} << 20}) {
      const double us = AllReduceMicros(ranks, n, n >= (1 << 20) ? 50 : 500);
      std::printf("all-reduce %d ranks, %8lld floats: %9.1f us\n", ranks, static_cast<long long>(n),
                  us);
      ar.push_back({{"ranks", ranks}, {"floats", n}, {"median_us", us}});
    }
  }
  result["all_reduce"] = ar;

  tessera::runner::TestModelSpec spec;
  spec.architecture = "Qwen3ForCausalLM";
  spec.vocab = 32000;
  spec.hidden = 1024;
  spec.intermediate = 3072;
  spec.layers = 12;
  spec.heads = 16;
  spec.kv_heads = 8;
  spec.head_dim = 64;
  spec.tie_embeddings = true;
  spec.dtype = tessera::model::DType::kBF16;
  const std::string dir = tessera::bench::MakeRandomModel(spec);
  auto model = tessera::model::LoadModel(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  result["model"] = {{"architecture", spec.architecture},
                     {"hidden", spec.hidden},
                     {"layers", spec.layers},
                     {"heads", spec.heads},
                     {"kv_heads", spec.kv_heads},
                     {"vocab", spec.vocab},
                     {"weights_dtype", "bf16"},
                     {"parameters", tessera::bench::ParameterCount(spec)}};
  const int steps = absl::GetFlag(FLAGS_steps);
  const int prompt = 32;
  nlohmann::json decode = nlohmann::json::array();
  for (int batch : {1, 8}) {
    double tp1_ms = 0;
    for (int ranks : {1, 2, 4}) {
      tessera::runner::CpuRunnerOptions ro;
      ro.block_size = 16;
      ro.num_kv_blocks = batch * ((prompt + steps) / 16 + 2);
      ro.num_threads = std::max(1, cores / ranks);
      std::unique_ptr<tessera::runner::ModelRunner> runner;
      if (ranks == 1) {
        auto r = tessera::runner::CpuModelRunner::Create(model->get(), ro);
        if (!r.ok()) return 1;
        runner = std::move(*r);
      } else {
        tp::TensorParallelOptions tpo;
        tpo.tensor_parallel_size = ranks;
        tpo.rank = ro;
        auto r = tp::TensorParallelRunner::Create(model->get(), tpo);
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
          return 1;
        }
        runner = std::move(*r);
      }
      const int64_t blocks_per_seq = ro.num_kv_blocks / batch;
      std::vector<std::vector<int32_t>> tables(batch);
      for (int s = 0; s < batch; ++s) {
        tables[s].resize(blocks_per_seq);
        std::iota(tables[s].begin(), tables[s].end(), static_cast<int32_t>(s * blocks_per_seq));
      }
      std::vector<float> logits;
      tessera::runner::ForwardBatch prefill;
      prefill.block_table_stride = blocks_per_seq;
      for (int s = 0; s < batch; ++s) {
        std::vector<int32_t> ids(prompt);
        for (int i = 0; i < prompt; ++i) ids[i] = (100 + 37 * i + s) % spec.vocab;
        prefill.AddSequence(ids, 0, tables[s], ro.block_size, true);
      }
      if (!runner->Forward(prefill, &logits).ok()) return 1;
      std::vector<double> step_ms;
      for (int step = 0; step < steps; ++step) {
        tessera::runner::ForwardBatch b;
        b.block_table_stride = blocks_per_seq;
        for (int s = 0; s < batch; ++s) {
          b.AddSequence({(7 * step + s) % spec.vocab}, prompt + step, tables[s], ro.block_size,
                        true);
        }
        auto start = Clock::now();
        if (!runner->Forward(b, &logits).ok()) return 1;
        step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
      std::sort(step_ms.begin(), step_ms.end());
      const double ms = step_ms[step_ms.size() / 2];
      if (ranks == 1) tp1_ms = ms;
      // Per step: 2 per layer + the embedding's, each of batch * hidden floats.
      const int reduces = ranks == 1 ? 0 : 2 * spec.layers + 1;
      const double reduce_us =
          ranks == 1 ? 0 : reduces * AllReduceMicros(ranks, int64_t{batch} * spec.hidden, 300);
      std::printf(
          "decode batch %d, TP=%d (%d threads/rank): %.2f ms/step, %.1f tok/s, "
          "all-reduce ~%.0f us/step (%d calls), speed vs TP=1 %.2fx\n",
          batch, ranks, ro.num_threads, ms, batch * 1e3 / ms, reduce_us, reduces, tp1_ms / ms);
      decode.push_back({{"batch", batch},
                        {"tensor_parallel_size", ranks},
                        {"threads_per_rank", ro.num_threads},
                        {"median_step_ms", ms},
                        {"tokens_per_second", batch * 1e3 / ms},
                        {"all_reduces_per_step", reduces},
                        {"all_reduce_us_per_step_estimate", reduce_us},
                        {"speed_vs_tp1", tp1_ms / ms}});
    }
  }
  result["decode"] = decode;
  result["load_average_1min_after"] = LoadAverage();
  tessera::bench::WriteResult(absl::GetFlag(FLAGS_out), argc, argv, result);
  return 0;
}
