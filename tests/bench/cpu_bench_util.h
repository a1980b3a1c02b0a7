// What the CPU kernel benchmarks (cpu_ops_bench, moe_cpu_bench) share:
// deterministic inputs, one thread pool per thread count, the ref/opt
// naming, registration with a "min" aggregate and the rate counters.
//
// Header-only (each benchmark is one translation unit).
//
// Thread-safety: Pool() is for the benchmark's main thread (registration
// and the benchmark bodies run there).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera::kernels::cpu::bench {

// Deterministic, fast fill (xorshift), values in [-scale, scale).
inline std::vector<float> Filled(size_t n, float scale = 1.0f,
                                 uint64_t seed = 88172645463325252ull) {
  std::vector<float> v(n);
  uint64_t x = seed;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return v;
}

// One pool per thread count, shared by all benchmarks of the program.
inline ThreadPool* Pool(int threads) {
  static auto* pools = new std::map<int, std::unique_ptr<ThreadPool>>;
  auto& p = (*pools)[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

// The optimized kernels on `threads` threads at this CPU's best ISA level.
inline CpuContext Opt(int threads) {
  return CpuContext{Pool(threads), BestCpuIsa(HostCpuFeatures())};
}

// The <impl> part of a benchmark name: "ref" (threads 0) or "opt_t<threads>".
inline std::string Impl(int threads) {
  return threads == 0 ? "ref" : absl::StrCat("opt_t", threads);
}

// Registers `fn` as `name`, timed in real time. With repetitions, "min"
// (the least disturbed run on a shared machine) joins the default
// mean/median/stddev/cv aggregates.
inline void Register(const std::string& name, std::function<void(benchmark::State&)> fn) {
  benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& s) { fn(s); })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond)
      ->ComputeStatistics("min", [](const std::vector<double>& v) {
        return *std::min_element(v.begin(), v.end());
      });
}

// GB/s (and GFLOP/s when `flops` > 0) per iteration of `state`.
inline void SetRates(benchmark::State& state, double bytes, double flops = 0) {
  using benchmark::Counter;
  state.counters["GB/s"] = Counter(bytes / 1e9, Counter::kIsIterationInvariantRate);
  if (flops > 0) {
    state.counters["GFLOP/s"] = Counter(flops / 1e9, Counter::kIsIterationInvariantRate);
  }
}

}  // namespace tessera::kernels::cpu::bench
