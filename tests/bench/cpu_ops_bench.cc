// Microbenchmarks of the optimized CPU kernels against the reference, and
// of this machine's memory bandwidth (the ceiling of a decode GEMV).
//
// Names: <op>/<impl>/<shape>, impl = ref | opt_t<threads> (opt at the best
// ISA level of this CPU unless the name says otherwise). Counters:
//   GB/s     bytes the op must move (weights / KV / activations) per second
//            (memory/*: the ceilings, memcpy counting bytes copied)
//   GFLOP/s  useful floating-point operations per second (GEMM, attention)
//
// Run (the results in tests/bench/results/cpu_ops.json come from this):
//   build/tests/bench/cpu_ops_bench --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//     --benchmark_out=tests/bench/results/cpu_ops.json
//     --benchmark_out_format=json
// The command line, the CPU features and the ISA level are recorded in the
// JSON "context". tests/bench/bench_summary.py turns the JSON into the
// ratio table of kernels/README.md.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/host_buffer.h"
#include "kernels/cpu/reference_ops.h"
#include "tests/bench/cpu_bench_util.h"

namespace tessera::kernels::cpu {
namespace {

using Counter = benchmark::Counter;
using bench::Filled;
using bench::Impl;
using bench::Opt;
using bench::Pool;
using bench::Register;
using bench::SetRates;

struct Weights {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  WeightMatrix view;
};

std::shared_ptr<Weights> MakeWeights(DType dtype, int64_t n, int64_t k) {
  auto w = std::make_shared<Weights>();
  std::vector<float> values = Filled(n * k, 0.05f);
  w->view = {nullptr, dtype, n, k};
  if (dtype == DType::kF32) {
    w->f32 = std::move(values);
    w->view.data = w->f32.data();
  } else {
    w->half.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      w->half[i] = dtype == DType::kBF16 ? F32ToBf16(values[i]).bits : F32ToF16(values[i]).bits;
    }
    w->view.data = w->half.data();
  }
  return w;
}

// ---------------------------------------------------------------------------
// Memory bandwidth: the ceiling for bandwidth-bound kernels.

constexpr size_t kBandwidthBytes = size_t{512} << 20;  // far beyond the last-level cache

// Sums n floats read as `kStreams` interleaved sequential streams. A GEMV
// reads 8 weight rows at once; more streams per core can draw more
// bandwidth, so both shapes are measured and the best is the ceiling.
template <int kStreams>
__attribute__((target("avx2"))) float ReadSum(const float* p, size_t n) {
  const size_t len = n / kStreams / 32 * 32;
  __m256 acc[kStreams];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t i = 0; i < len; i += 32) {
    for (int s = 0; s < kStreams; ++s) {
      const float* q = p + s * len + i;
      const __m256 lo = _mm256_add_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(q + 8));
      const __m256 hi = _mm256_add_ps(_mm256_loadu_ps(q + 16), _mm256_loadu_ps(q + 24));
      acc[s] = _mm256_add_ps(acc[s], _mm256_add_ps(lo, hi));
    }
  }
  __m256 total = _mm256_setzero_ps();
  for (const __m256& a : acc) total = _mm256_add_ps(total, a);
  float lanes[8];
  _mm256_storeu_ps(lanes, total);
  return std::accumulate(lanes, lanes + 8, 0.0f);
}

void RegisterBandwidth() {
  for (int threads : {1, 2}) {
    Register(absl::StrCat("memory/memcpy/t", threads), [threads](benchmark::State& state) {
      std::vector<char> src(kBandwidthBytes, 1), dst(kBandwidthBytes, 2);
      ThreadPool* pool = Pool(threads);
      for (auto _ : state) {
        pool->ParallelFor(threads, 1, [&](int64_t b, int64_t e) {
          for (int64_t t = b; t < e; ++t) {
            const size_t part = kBandwidthBytes / threads;
            std::memcpy(dst.data() + t * part, src.data() + t * part, part);
          }
        });
        benchmark::ClobberMemory();
      }
      // Bytes copied per second (each byte is read once and written once).
      SetRates(state, kBandwidthBytes);
    });
    if (!HostCpuFeatures().avx2) continue;
    for (int streams : {1, 8}) {
      Register(absl::StrCat("memory/read_", streams, "stream/t", threads),
               [threads, streams](benchmark::State& state) {
                 std::vector<float> src(kBandwidthBytes / sizeof(float), 1.0f);
                 ThreadPool* pool = Pool(threads);
                 std::vector<float> sums(threads);
                 for (auto _ : state) {
                   pool->ParallelFor(threads, 1, [&](int64_t b, int64_t e) {
                     for (int64_t t = b; t < e; ++t) {
                       const size_t part = src.size() / threads;
                       const float* p = src.data() + t * part;
                       sums[t] = streams == 1 ? ReadSum<1>(p, part) : ReadSum<8>(p, part);
                     }
                   });
                   benchmark::DoNotOptimize(sums.data());
                 }
                 SetRates(state, kBandwidthBytes);
               });
    }
  }
}

// ---------------------------------------------------------------------------
// GEMV / GEMM.

void RegisterGemm(int64_t m, int64_t n, int64_t k, DType dtype, std::vector<int> impls) {
  for (int threads : impls) {
    const std::string name = absl::StrCat(m == 1 ? "gemv/" : "gemm/", std::string(DTypeName(dtype)),
                                          "/", Impl(threads), "/m", m, "_n", n, "_k", k);
    Register(name, [=](benchmark::State& state) {
      static std::map<std::tuple<int64_t, int64_t, int>, std::shared_ptr<Weights>> cache;
      auto& w = cache[{n, k, static_cast<int>(dtype)}];
      if (!w) w = MakeWeights(dtype, n, k);
      const std::vector<float> x = Filled(m * k);
      std::vector<float> y(m * n);
      for (auto _ : state) {
        if (threads == 0) {
          reference::Gemm(x.data(), m, w->view, nullptr, y.data());
        } else {
          Gemm(Opt(threads), x.data(), m, w->view, nullptr, y.data());
        }
        benchmark::DoNotOptimize(y.data());
      }
      const double bytes = double(n) * k * DTypeSize(dtype) + 4.0 * (m * k + m * n);
      SetRates(state, bytes, 2.0 * m * n * k);
    });
  }
}

// ---------------------------------------------------------------------------
// Paged attention.

struct AttentionData {
  HostBuffer k, v;  // the KV cache, as a worker should allocate it
  std::vector<float> q, out;
  std::vector<int32_t> query_start_loc, seq_lens, block_tables;
  PagedAttentionArgs args;
  double kv_bytes = 0, flops = 0;
};

std::shared_ptr<AttentionData> MakeAttention(int seqs, int context, int q_len, int heads,
                                             int kv_heads, int d, int bs) {
  auto a = std::make_shared<AttentionData>();
  const int seq_len = context + q_len;
  const int blocks_per_seq = (seq_len + bs - 1) / bs;
  const int64_t blocks = int64_t{seqs} * blocks_per_seq;
  const int64_t slot_stride = int64_t{kv_heads} * d;
  const size_t cache_floats = blocks * bs * slot_stride;
  a->k = *HostBuffer::Allocate(cache_floats * sizeof(float));
  a->v = *HostBuffer::Allocate(cache_floats * sizeof(float));
  const std::vector<float> k_values = Filled(cache_floats, 1.0f, 1);
  const std::vector<float> v_values = Filled(cache_floats, 1.0f, 2);
  std::memcpy(a->k.data(), k_values.data(), cache_floats * sizeof(float));
  std::memcpy(a->v.data(), v_values.data(), cache_floats * sizeof(float));
  a->q = Filled(int64_t{seqs} * q_len * heads * d, 1.0f, 3);
  a->out.resize(a->q.size());
  a->query_start_loc.push_back(0);
  for (int s = 0; s < seqs; ++s) {
    a->seq_lens.push_back(seq_len);
    a->query_start_loc.push_back(a->query_start_loc.back() + q_len);
    // Interleave the sequences' blocks, as a busy block manager would.
    for (int b = 0; b < blocks_per_seq; ++b) a->block_tables.push_back(b * seqs + s);
  }
  PagedAttentionArgs& args = a->args;
  args.q = a->q.data();
  args.q_token_stride = int64_t{heads} * d;
  args.num_heads = heads;
  args.cache = PagedKvCache{a->k.As<float>(), a->v.As<float>(), blocks, bs, kv_heads, d};
  args.query_start_loc = a->query_start_loc;
  args.seq_lens = a->seq_lens;
  args.block_tables = a->block_tables;
  args.block_table_stride = blocks_per_seq;
  args.scale = 1.0f / std::sqrt(static_cast<float>(d));
  args.out = a->out.data();
  // Keys each query attends to (causal), K and V bytes read once per kv head.
  double attended = 0;
  for (int t = 0; t < q_len; ++t) attended += context + t + 1;
  a->flops = 4.0 * seqs * heads * d * attended;
  a->kv_bytes = 2.0 * 4.0 * seqs * double(seq_len) * slot_stride;
  return a;
}

void RegisterAttention(const std::string& kind, int seqs, int context, int q_len,
                       std::vector<int> impls) {
  for (int threads : impls) {
    const std::string name = absl::StrCat("attention_", kind, "/", Impl(threads), "/seqs", seqs,
                                          "_ctx", context, "_q", q_len, "_h32_kv8_d128_bs16");
    Register(name, [=](benchmark::State& state) {
      auto a = MakeAttention(getenv("SEQS") ? atoi(getenv("SEQS")) : seqs,
                             getenv("CTX") ? atoi(getenv("CTX")) : context, q_len,
                             getenv("KVH1") ? 4 : 32, getenv("KVH1") ? 1 : 8, 128, 16);
      for (auto _ : state) {
        absl::Status s = threads == 0 ? reference::PagedAttention(a->args)
                                      : PagedAttention(Opt(threads), a->args);
        if (!s.ok()) state.SkipWithError(s.ToString().c_str());
        benchmark::DoNotOptimize(a->out.data());
      }
      SetRates(state, a->kv_bytes, a->flops);
    });
  }
}

// ---------------------------------------------------------------------------
// Elementwise and logits ops.

void RegisterElementwise() {
  for (int64_t rows : {1, 128}) {
    const int64_t dim = 4096;
    for (int threads : {0, 1, 2}) {
      Register(absl::StrCat("fused_add_rmsnorm/", Impl(threads), "/rows", rows, "_dim", dim),
               [=](benchmark::State& state) {
                 std::vector<float> x = Filled(rows * dim), r = Filled(rows * dim, 1.0f, 5);
                 const std::vector<float> w = Filled(dim);
                 for (auto _ : state) {
                   if (threads == 0) {
                     reference::FusedAddRmsNorm(x.data(), r.data(), w.data(), rows, dim, 1e-5f);
                   } else {
                     FusedAddRmsNorm(Opt(threads), x.data(), r.data(), w.data(), rows, dim, 1e-5f);
                   }
                   benchmark::DoNotOptimize(x.data());
                 }
                 SetRates(state, 4.0 * rows * dim * 4);  // read x, r; write x, r
               });
    }
    for (int threads : {0, 1, 2}) {
      Register(absl::StrCat("rope/", Impl(threads), "/tokens", rows, "_h32_kv8_d128"),
               [=](benchmark::State& state) {
                 const int d = 128, heads = 32, kv = 8;
                 std::vector<float> q = Filled(rows * heads * d), k = Filled(rows * kv * d);
                 std::vector<float> inv_freq(d / 2);
                 for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(500000.0f, -2.0f * i / d);
                 std::vector<int32_t> pos(rows);
                 std::iota(pos.begin(), pos.end(), 1000);
                 for (auto _ : state) {
                   if (threads == 0) {
                     reference::Rope(pos, inv_freq, d, q.data(), heads, heads * d, k.data(), kv,
                                     kv * d);
                   } else {
                     Rope(Opt(threads), pos, inv_freq, d, q.data(), heads, heads * d, k.data(), kv,
                          kv * d);
                   }
                   benchmark::DoNotOptimize(q.data());
                 }
                 SetRates(state, 2.0 * 4 * rows * (heads + kv) * d);
               });
    }
    for (int threads : {0, 1, 2}) {
      const int64_t inter = 14336;
      Register(absl::StrCat("silu_mul/", Impl(threads), "/rows", rows, "_inter", inter),
               [=](benchmark::State& state) {
                 const std::vector<float> gate_up = Filled(rows * 2 * inter, 8.0f);
                 std::vector<float> out(rows * inter);
                 for (auto _ : state) {
                   if (threads == 0) {
                     reference::SiluMul(gate_up.data(), rows, inter, out.data());
                   } else {
                     SiluMul(Opt(threads), gate_up.data(), rows, inter, out.data());
                   }
                   benchmark::DoNotOptimize(out.data());
                 }
                 SetRates(state, 3.0 * 4 * rows * inter);
               });
    }
  }
  for (int threads : {0, 2}) {
    Register(absl::StrCat("embedding/bf16/", Impl(threads), "/tokens128_hidden4096"),
             [=](benchmark::State& state) {
               auto w = MakeWeights(DType::kBF16, 32000, 4096);
               std::vector<int32_t> ids(128);
               for (int i = 0; i < 128; ++i) ids[i] = (i * 7919) % 32000;
               std::vector<float> out(128 * 4096);
               for (auto _ : state) {
                 absl::Status s = threads == 0 ? reference::Embedding(w->view, ids, out.data())
                                               : Embedding(Opt(threads), w->view, ids, out.data());
                 benchmark::DoNotOptimize(s);
                 benchmark::DoNotOptimize(out.data());
               }
               SetRates(state, 128.0 * 4096 * (2 + 4));
             });
    Register(absl::StrCat("kv_cache_write/", Impl(threads), "/tokens128_kv8_d128"),
             [=](benchmark::State& state) {
               const int64_t row = 8 * 128;
               std::vector<float> k = Filled(128 * row), v = Filled(128 * row);
               std::vector<float> kc(4096 * row), vc(4096 * row);
               PagedKvCache cache{kc.data(), vc.data(), 256, 16, 8, 128};
               std::vector<int64_t> slots(128);
               for (int i = 0; i < 128; ++i) slots[i] = (i * 37) % 4096;
               for (auto _ : state) {
                 absl::Status s =
                     threads == 0
                         ? reference::WriteKvCache(k.data(), row, v.data(), row, slots, cache)
                         : WriteKvCache(Opt(threads), k.data(), row, v.data(), row, slots, cache);
                 benchmark::DoNotOptimize(s);
                 benchmark::DoNotOptimize(kc.data());
               }
               SetRates(state, 2.0 * 2 * 4 * 128 * row);
             });
  }
  const int64_t vocab = 151936;
  for (int threads : {0, 1}) {
    Register(absl::StrCat("softmax/", Impl(threads), "/rows1_vocab", vocab),
             [=](benchmark::State& state) {
               const std::vector<float> x = Filled(vocab, 20.0f);
               std::vector<float> out(vocab);
               for (auto _ : state) {
                 if (threads == 0) {
                   reference::Softmax(x.data(), 1, vocab, out.data());
                 } else {
                   Softmax(Opt(threads), x.data(), 1, vocab, out.data());
                 }
                 benchmark::DoNotOptimize(out.data());
               }
               SetRates(state, 8.0 * vocab);
             });
    Register(absl::StrCat("log_softmax/", Impl(threads), "/rows1_vocab", vocab),
             [=](benchmark::State& state) {
               const std::vector<float> x = Filled(vocab, 20.0f);
               std::vector<float> out(vocab);
               for (auto _ : state) {
                 if (threads == 0) {
                   reference::LogSoftmax(x.data(), 1, vocab, out.data());
                 } else {
                   LogSoftmax(Opt(threads), x.data(), 1, vocab, out.data());
                 }
                 benchmark::DoNotOptimize(out.data());
               }
               SetRates(state, 8.0 * vocab);
             });
    Register(absl::StrCat("argmax/", Impl(threads), "/rows1_vocab", vocab),
             [=](benchmark::State& state) {
               const std::vector<float> x = Filled(vocab, 20.0f);
               int32_t out = 0;
               for (auto _ : state) {
                 if (threads == 0) {
                   reference::Argmax(x.data(), 1, vocab, &out);
                 } else {
                   Argmax(Opt(threads), x.data(), 1, vocab, &out);
                 }
                 benchmark::DoNotOptimize(out);
               }
               SetRates(state, 4.0 * vocab);
             });
  }
  Register("thread_pool/parallel_for_empty/t2", [](benchmark::State& state) {
    ThreadPool* pool = Pool(2);
    for (auto _ : state) {
      pool->ParallelFor(2, 1, [](int64_t, int64_t) {});
    }
  });
}

void RegisterAll() {
  RegisterBandwidth();
  // Decode GEMV on bf16 weights: the bandwidth-bound step of every layer.
  RegisterGemm(1, 4096, 4096, DType::kBF16, {0, 1, 2});
  RegisterGemm(1, 14336, 4096, DType::kBF16, {1, 2});
  RegisterGemm(1, 4096, 14336, DType::kBF16, {1, 2});
  RegisterGemm(1, 4096, 4096, DType::kF16, {2});
  RegisterGemm(1, 4096, 4096, DType::kF32, {2});
  // Small-batch decode and prefill GEMM.
  RegisterGemm(8, 4096, 4096, DType::kBF16, {2});
  RegisterGemm(128, 2048, 2048, DType::kBF16, {0, 1, 2});
  RegisterGemm(512, 2048, 2048, DType::kBF16, {2});
  // Attention.
  RegisterAttention("decode", 8, 2047, 1, {0, 1, 2});
  RegisterAttention("prefill", 1, 0, 512, {0, 1, 2});
  RegisterAttention("prefill_chunk", 1, 1536, 512, {2});
  RegisterElementwise();
}

}  // namespace
}  // namespace tessera::kernels::cpu

int main(int argc, char** argv) {
  using namespace tessera::kernels::cpu;
  std::vector<std::string> args(argv, argv + argc);
  benchmark::AddCustomContext("command", absl::StrJoin(args, " "));
  benchmark::AddCustomContext("cpu_brand", HostCpuFeatures().brand);
  benchmark::AddCustomContext("cpu_features", HostCpuFeatures().FeatureList());
  benchmark::AddCustomContext("opt_isa", std::string(CpuIsaName(BestCpuIsa(HostCpuFeatures()))));
  RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
