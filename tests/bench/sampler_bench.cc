// Microbenchmark of the CPU sampler on a Llama-3/Qwen-sized vocabulary.
// Run: build/worker/sampling/sampler_bench
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "worker/sampling/sampler.h"

namespace tessera::sampling {
namespace {

std::vector<float> Logits(int vocab) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

void Run(benchmark::State& state, const SamplingParams& params) {
  const std::vector<float> logits = Logits(static_cast<int>(state.range(0)));
  TokenCounts counts;
  for (int32_t t = 0; t < 2000; t += 3) counts.AddPrompt(std::vector<int32_t>{t});
  int64_t position = 0;
  for (auto _ : state) {
    absl::StatusOr<SampleResult> r = Sample(logits, params, counts, position++);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Greedy(benchmark::State& s) { Run(s, {.temperature = 0}); }
void BM_Temperature(benchmark::State& s) { Run(s, {.temperature = 0.8f}); }
void BM_TopK50(benchmark::State& s) { Run(s, {.temperature = 0.8f, .top_k = 50}); }
void BM_TopP095(benchmark::State& s) { Run(s, {.temperature = 0.8f, .top_p = 0.95f}); }
void BM_MinP005(benchmark::State& s) { Run(s, {.temperature = 0.8f, .min_p = 0.05f}); }
void BM_AllWithLogprobs(benchmark::State& s) {
  Run(s, {.temperature = 0.8f,
          .top_k = 100,
          .top_p = 0.9f,
          .min_p = 0.02f,
          .repetition_penalty = 1.1f,
          .presence_penalty = 0.5f,
          .frequency_penalty = 0.5f,
          .top_logprobs = 5});
}

BENCHMARK(BM_Greedy)->Arg(151936);
BENCHMARK(BM_Temperature)->Arg(151936);
BENCHMARK(BM_TopK50)->Arg(151936);
BENCHMARK(BM_TopP095)->Arg(151936);
BENCHMARK(BM_MinP005)->Arg(151936);
BENCHMARK(BM_AllWithLogprobs)->Arg(151936);

}  // namespace
}  // namespace tessera::sampling

BENCHMARK_MAIN();
