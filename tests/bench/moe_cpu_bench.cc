// Microbenchmarks of the CPU mixture-of-experts kernels (kernels/cpu/
// moe_routing.h, moe_experts.h), optimized against the reference, on
// Qwen3-30B-A3B's expert shapes (hidden 2048, 128 experts of width 768,
// top-8) scaled down in expert count so the weights fit a small machine:
// 32 experts of the real width, bf16.
//
// Names: moe_experts/<impl>/tokens<T>, moe_routing/<scoring>/tokens<T>;
// impl = ref | opt_t<threads>. Counters:
//   GB/s     bytes of the experts actually chosen (each chosen expert's
//            gate/up/down read once per call) per second: the quantity a
//            decode step is bound by
//   GFLOP/s  2 * 3 * hidden * width per (token, chosen expert) per second
//
// Run: build/tests/bench/moe_cpu_bench --benchmark_repetitions=3
//        --benchmark_report_aggregates_only=true
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "tests/bench/cpu_bench_util.h"

namespace tessera::kernels::cpu {
namespace {

using Counter = benchmark::Counter;
using bench::Filled;
using bench::Impl;
using bench::Pool;
using bench::Register;
using bench::SetRates;

constexpr int64_t kHidden = 2048, kWidth = 768;
constexpr int kExperts = 32, kTopK = 8;

// The experts' bf16 weights, built once.
struct Experts {
  std::vector<std::vector<bf16_t>> storage;
  std::vector<WeightMatrix> gate_up, down;
};

const Experts& BenchExperts() {
  static const Experts* experts = [] {
    auto* e = new Experts;
    auto matrix = [e](int64_t rows, int64_t cols, uint64_t seed) {
      e->storage.emplace_back();
      for (float v : Filled(rows * cols, 0.05f, seed)) e->storage.back().push_back(F32ToBf16(v));
      return WeightMatrix{e->storage.back().data(), DType::kBF16, rows, cols};
    };
    for (int i = 0; i < kExperts; ++i) {
      e->gate_up.push_back(matrix(2 * kWidth, kHidden, 11 + i));
      e->down.push_back(matrix(kHidden, kWidth, 1011 + i));
    }
    return e;
  }();
  return *experts;
}

// Softmax top-8 routing of random router logits for `tokens` tokens.
void Route(int64_t tokens, std::vector<int32_t>* ids, std::vector<float>* weights) {
  const std::vector<float> logits = Filled(tokens * kExperts, 3.0f, 7);
  ids->resize(tokens * kTopK);
  weights->resize(tokens * kTopK);
  reference::MoeRoute(logits.data(), tokens,
                      MoeRoutingParams{MoeScoringFunction::kSoftmax, kExperts, kTopK, true},
                      ids->data(), weights->data());
}

void RegisterExperts() {
  for (int64_t tokens : {1, 8, 64, 256}) {
    for (int threads : {0, 1, 2}) {
      if (threads == 0 && tokens > 8) continue;  // the reference is too slow to matter there
      const std::string impl = Impl(threads);
      Register(absl::StrCat("moe_experts/", impl, "/tokens", tokens), [=](benchmark::State& st) {
        const Experts& e = BenchExperts();
        const std::vector<float> x = Filled(tokens * kHidden, 1.0f, 3);
        std::vector<int32_t> ids;
        std::vector<float> weights;
        Route(tokens, &ids, &weights);
        std::vector<float> out(tokens * kHidden);
        MoeExpertsArgs a{x.data(), tokens,     kHidden,        e.gate_up, e.down,
                         0,        ids.data(), weights.data(), kTopK,     out.data()};
        const CpuContext ctx{threads > 0 ? Pool(threads) : nullptr, BestCpuIsa(HostCpuFeatures())};
        for (auto _ : st) {
          if (threads == 0) {
            reference::MoeExperts(a);
          } else {
            MoeExperts(ctx, a);
          }
          benchmark::DoNotOptimize(out.data());
        }
        const std::set<int32_t> chosen(ids.begin(), ids.end());
        const double bytes = chosen.size() * 3.0 * kHidden * kWidth * sizeof(bf16_t);
        const double flops = tokens * kTopK * 2.0 * 3 * kHidden * kWidth;
        SetRates(st, bytes, flops);
        st.counters["experts_touched"] = static_cast<double>(chosen.size());
      });
    }
  }
}

void RegisterRouting() {
  for (int64_t tokens : {1, 64, 4096}) {
    for (bool grouped : {false, true}) {
      Register(
          absl::StrCat("moe_routing/", grouped ? "sigmoid_grouped" : "softmax", "/tokens", tokens),
          [=](benchmark::State& st) {
            const std::vector<float> logits = Filled(tokens * 128, 3.0f, 5);
            const std::vector<float> bias = Filled(128, 0.05f, 9);
            MoeRoutingParams p{MoeScoringFunction::kSoftmax, 128, 8, true};
            if (grouped) {
              p = {MoeScoringFunction::kSigmoidGrouped, 128, 8, true, 8, 4, 2.5f, bias.data()};
            }
            std::vector<int32_t> ids(tokens * 8);
            std::vector<float> weights(tokens * 8);
            const CpuContext ctx{Pool(2), BestCpuIsa(HostCpuFeatures())};
            for (auto _ : st) {
              MoeRoute(ctx, logits.data(), tokens, p, ids.data(), weights.data());
              benchmark::DoNotOptimize(ids.data());
            }
            st.counters["tokens/s"] =
                Counter(static_cast<double>(tokens), Counter::kIsIterationInvariantRate);
          });
    }
  }
}

}  // namespace
}  // namespace tessera::kernels::cpu

int main(int argc, char** argv) {
  tessera::kernels::cpu::RegisterExperts();
  tessera::kernels::cpu::RegisterRouting();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
