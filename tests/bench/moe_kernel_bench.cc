// Microbenchmark of the CUDA mixture-of-experts kernels at Qwen3-30B-A3B
// shapes (hidden 2048, 128 experts, top-8, expert width 768), random bf16
// weights and random router logits (softmax top-8, renormalised):
//   - the whole routed-expert block (MoeExperts: grouping, gate/up +
//     SiLU-mul, down, combine) at T = 1, 8 through the pair-major GEMVs
//     (no grouping, down fused with the combine), T = 1, 8, 64 through the
//     grouped GEMVs and
//     T = 64, 4096 through the grouped GEMM (its mma.sync kernel and the
//     default, wgmma on SM 9.0), and each stage alone;
//   - routing (MoeRoute) at every T;
//   - the router from the layer input to the routed experts ("router"):
//     the old path (cuBLAS/GEMV of the bf16 xb to fp32 logits, then
//     MoeRoute), the fused fp32 router (moe_router.h) at T <= 64 (plain and
//     programmatic launch) and the hi/lo split router at T >= 64, with the
//     router weights cycled over 128 layer copies (64 MB > L2);
//   - the pair GEMVs at T = 1, 8, each kernel alone and the pair path
//     whole ("pair_kernels");
//   - the grouped GEMV against the grouped GEMM at T = 16 .. 128, for
//     kMoeGemvMaxTokens ("crossover");
//   - one whole sparse layer at batch 1 from the residual ("layer_b1"):
//     the bf16 router (GEMV of xb, MoeRoute) against the fused fp32 router,
//     each followed by the pair GEMVs.
// A summary table goes to stderr.
// Each result reports the bytes of the experts the step selected (each
// read once) over the time, as a fraction of a device-to-device copy's
// bandwidth measured in the same run and of the 4.8 TB/s nominal, and the
// active FLOPs (T * k * 3 * 2 * H * I) over the time as a fraction of the
// 989 TFLOP/s dense bf16 nominal (and of the 785 TFLOP/s the issue uses).
// The weights are cycled over several layer copies (>= 4.8 GB) so that a
// step reads them from HBM, not from the 50 MB L2. One JSON document on
// stdout.
//
//   build/tests/bench/moe_kernel_bench > moe_kernels.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_grouping.h"
#include "kernels/cuda/moe_pair_gemv.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/random_fill.h"
#include "nlohmann/json.hpp"

namespace tessera::kernels::cuda {
namespace {

constexpr int64_t kHidden = 2048;
constexpr int64_t kInter = 768;
constexpr int kExperts = 128;
constexpr int kTopK = 8;
constexpr int kLayerCopies = 4;
constexpr int kRouterCopies = 128;  // 64 MB of router weights: beyond L2
constexpr double kNominalHbm = 4.8e12;
constexpr double kNominalBf16 = 989e12;
constexpr double kIssueBf16Peak = 785e12;

#define BENCH_CHECK(expr)                                                               \
  do {                                                                                  \
    const absl::Status bench_status_ = (expr);                                          \
    if (!bench_status_.ok()) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #expr, bench_status_.ToString().c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

template <class T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

// Mean seconds per call of fn(i): 3 warm-up calls, then batches until at
// least 30 ms of GPU time (or 2000 calls).
double TimeIt(CudaStream s, const std::function<absl::Status(int)>& fn) {
  for (int i = 0; i < 3; ++i) BENCH_CHECK(fn(i));
  BENCH_CHECK(Synchronize(s));
  Event start = Must(Event::Create(), "Event::Create");
  Event stop = Must(Event::Create(), "Event::Create");
  int iters = 5;
  while (true) {
    BENCH_CHECK(start.Record(s));
    for (int i = 0; i < iters; ++i) BENCH_CHECK(fn(i));
    BENCH_CHECK(stop.Record(s));
    BENCH_CHECK(stop.Synchronize());
    const float ms = Must(Event::ElapsedMs(start, stop), "ElapsedMs");
    if (ms >= 30.0f || iters >= 2000) return ms * 1e-3 / iters;
    iters = std::min(2000, static_cast<int>(iters * std::max(2.0f, 35.0f / std::max(ms, 0.01f))));
  }
}

DeviceBuffer Allocate(size_t bytes) { return Must(DeviceBuffer::Allocate(bytes), "Allocate"); }

// Bytes per second of a 1 GiB device-to-device copy (read + write).
double CopyBandwidth(CudaStream s) {
  constexpr size_t kBytes = size_t{1} << 30;
  DeviceBuffer a = Allocate(kBytes), b = Allocate(kBytes);
  BENCH_CHECK(MemsetDevice(a.data(), 1, kBytes, s));
  const double sec =
      TimeIt(s, [&](int) { return CopyDeviceToDevice(b.data(), a.data(), kBytes, s); });
  return 2.0 * kBytes / sec;
}

struct Layers {
  std::vector<DeviceBuffer> gate_up, down;
  MoeExpertWeights At(int i) const {
    const int l = i % kLayerCopies;
    return MoeExpertWeights{gate_up[l].as<Bf16>(), down[l].as<Bf16>(), kExperts, kHidden, kInter};
  }
};

Layers RandomLayers(CudaStream s) {
  Layers l;
  const int64_t gu = kExperts * 2 * kInter * kHidden, dn = kExperts * kHidden * kInter;
  const float scale = 1.0f / 45.0f;  // about 1 / sqrt(hidden): O(1) activations
  for (int i = 0; i < kLayerCopies; ++i) {
    l.gate_up.push_back(Allocate(gu * sizeof(Bf16)));
    l.down.push_back(Allocate(dn * sizeof(Bf16)));
    BENCH_CHECK(FillRandomBf16(l.gate_up.back().as<Bf16>(), gu, 100 + i, scale, s));
    BENCH_CHECK(FillRandomBf16(l.down.back().as<Bf16>(), dn, 200 + i, scale, s));
  }
  return l;
}

// One step's inputs at T tokens: x, routed ids and weights, a workspace.
struct Step {
  int64_t tokens = 0;
  DeviceBuffer logits, x, ids, weights, out, workspace, groups;
  MoeRoutingParams routing;
  MoeGroups g;
  int selected_experts = 0;
};

Step MakeStep(int64_t tokens, const Layers& layers, CudaStream s) {
  Step st;
  st.tokens = tokens;
  std::mt19937 rng(static_cast<uint32_t>(tokens));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(tokens * kExperts);
  for (float& v : logits) v = dist(rng);
  st.logits = Allocate(logits.size() * sizeof(float));
  BENCH_CHECK(CopyToDevice(st.logits.data(), logits.data(), logits.size() * sizeof(float), s));
  st.x = Allocate(tokens * kHidden * sizeof(Bf16));
  BENCH_CHECK(FillRandomBf16(st.x.as<Bf16>(), tokens * kHidden, 7, 1.0f, s));
  st.ids = Allocate(tokens * kTopK * sizeof(int32_t));
  st.weights = Allocate(tokens * kTopK * sizeof(float));
  st.out = Allocate(tokens * kHidden * sizeof(Bf16));
  st.routing.num_experts = kExperts;
  st.routing.top_k = kTopK;
  st.routing.renormalize = true;
  BENCH_CHECK(MoeRoute(st.logits.as<float>(), tokens, st.routing, st.ids.as<int32_t>(),
                       st.weights.as<float>(), s));
  st.workspace = Allocate(MoeExpertsWorkspaceBytes(tokens, kTopK, layers.At(0)));
  st.groups = Allocate(sizeof(int32_t) * MoeGroupsInts(tokens, kTopK, kExperts));
  st.g = CarveMoeGroups(st.groups.as<int32_t>(), tokens, kTopK, kExperts);
  BENCH_CHECK(MoeGroupByExpert(st.ids.as<int32_t>(), tokens, 0, st.g, s));
  std::vector<int32_t> ids(tokens * kTopK);
  BENCH_CHECK(Synchronize(s));
  BENCH_CHECK(CopyToHost(ids.data(), st.ids.data(), ids.size() * sizeof(int32_t)));
  st.selected_experts = static_cast<int>(std::set<int32_t>(ids.begin(), ids.end()).size());
  return st;
}

MoeExpertsArgs ExpertsArgs(const Step& st, const MoeExpertWeights& w, MoeExpertsPath path,
                           MoeGemmKernelKind kernel) {
  MoeExpertsArgs a;
  a.x = st.x.as<Bf16>();
  a.num_tokens = st.tokens;
  a.ids = st.ids.as<int32_t>();
  a.weights = st.weights.as<float>();
  a.top_k = kTopK;
  a.experts = w;
  a.out = st.out.as<Bf16>();
  a.workspace = st.workspace.data();
  a.workspace_bytes = st.workspace.size();
  a.max_tokens = st.tokens;
  a.path = path;
  a.gemm_kernel = kernel;
  return a;
}

// Seconds of each stage alone (on the step's own groups and scratch).
nlohmann::json StageTimes(const Step& st, const Layers& layers, bool gemm, MoeGemmKernelKind kernel,
                          CudaStream s) {
  const int64_t rows = st.tokens * kTopK;
  DeviceBuffer act = Allocate(rows * kInter * sizeof(Bf16));
  DeviceBuffer y = Allocate(rows * kHidden * sizeof(Bf16));
  const int64_t T = st.tokens;
  nlohmann::json j;
  j["group_us"] =
      1e6 * TimeIt(s, [&](int) { return MoeGroupByExpert(st.ids.as<int32_t>(), T, 0, st.g, s); });
  j["gate_up_us"] =
      1e6 * TimeIt(s, [&](int i) {
        return gemm ? MoeGemmGateUp(st.x.as<Bf16>(), T, layers.At(i), st.g, act.as<Bf16>(), s,
                                    kernel)
                    : MoeGemvGateUp(st.x.as<Bf16>(), T, layers.At(i), st.g, act.as<Bf16>(), s);
      });
  j["down_us"] =
      1e6 * TimeIt(s, [&](int i) {
        return gemm ? MoeGemmDown(act.as<Bf16>(), T, layers.At(i), st.g, y.as<Bf16>(), s, kernel)
                    : MoeGemvDown(act.as<Bf16>(), T, layers.At(i), st.g, y.as<Bf16>(), s);
      });
  const MoeCombineArgs c{
      y.as<Bf16>(), st.ids.as<int32_t>(), st.weights.as<float>(), &st.g, nullptr, T,
      kHidden,      st.out.as<Bf16>()};
  j["combine_us"] = 1e6 * TimeIt(s, [&](int) { return MoeCombine(c, s); });
  return j;
}

nlohmann::json Measure(const Step& st, const Layers& layers, MoeExpertsPath path,
                       MoeGemmKernelKind kernel, double copy_bw, CudaStream s) {
  const double sec = TimeIt(s, [&](int i) {
    MoeExpertsArgs a = ExpertsArgs(st, layers.At(i), path, kernel);
    return MoeExperts(a, s);
  });
  const double bytes =
      static_cast<double>(st.selected_experts) * 3 * kInter * kHidden * sizeof(Bf16);
  const double flops = static_cast<double>(st.tokens) * kTopK * 3 * 2 * kHidden * kInter;
  const bool gemm = path == MoeExpertsPath::kGroupedGemm;
  nlohmann::json j;
  j["tokens"] = st.tokens;
  j["path"] = path == MoeExpertsPath::kGemvPairs      ? "gemv_pairs"
              : !gemm                                 ? "gemv"
              : kernel == MoeGemmKernelKind::kMmaSync ? "grouped_gemm_mma_sync"
                                                      : "grouped_gemm_auto";
  j["us"] = sec * 1e6;
  j["selected_experts"] = st.selected_experts;
  j["selected_bytes"] = bytes;
  j["bytes_per_s"] = bytes / sec;
  j["fraction_of_copy_bw"] = bytes / sec / copy_bw;
  j["fraction_of_4_8_tbps"] = bytes / sec / kNominalHbm;
  j["active_flops"] = flops;
  j["tflops"] = flops / sec * 1e-12;
  j["fraction_of_989_tflops"] = flops / sec / kNominalBf16;
  j["fraction_of_785_tflops"] = flops / sec / kIssueBf16Peak;
  if (path != MoeExpertsPath::kGemvPairs) j["stages"] = StageTimes(st, layers, gemm, kernel, s);
  return j;
}

// ---- router ----

struct Router {
  DeviceBuffer weights;  // kRouterCopies x [E, H] bf16
  DeviceBuffer residual, norm, xb, split, logits, counters, ids, w;
  const Bf16* At(int i) const {
    return weights.as<Bf16>() + static_cast<int64_t>(i % kRouterCopies) * kExperts * kHidden;
  }
};

Router MakeRouter(int64_t tokens, CudaStream s) {
  Router r;
  r.weights = Allocate(sizeof(Bf16) * kRouterCopies * kExperts * kHidden);
  BENCH_CHECK(FillRandomBf16(r.weights.as<Bf16>(), kRouterCopies * kExperts * kHidden, 300,
                             1.0f / 45.0f, s));
  std::mt19937 rng(static_cast<uint32_t>(tokens) + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> residual(tokens * kHidden), norm(kHidden);
  for (float& v : residual) v = dist(rng);
  for (float& v : norm) v = 1.0f + 0.1f * dist(rng);
  r.residual = Allocate(residual.size() * sizeof(float));
  r.norm = Allocate(norm.size() * sizeof(float));
  BENCH_CHECK(CopyToDevice(r.residual.data(), residual.data(), residual.size() * sizeof(float), s));
  BENCH_CHECK(CopyToDevice(r.norm.data(), norm.data(), norm.size() * sizeof(float), s));
  r.xb = Allocate(tokens * kHidden * sizeof(Bf16));
  BENCH_CHECK(FillRandomBf16(r.xb.as<Bf16>(), tokens * kHidden, 8, 1.0f, s));
  r.split = Allocate(2 * tokens * kHidden * sizeof(Bf16));
  r.logits = Allocate(2 * tokens * kExperts * sizeof(float));
  r.counters = Allocate(tokens * sizeof(int32_t));
  BENCH_CHECK(MemsetDevice(r.counters.data(), 0, r.counters.size(), s));
  r.ids = Allocate(tokens * kTopK * sizeof(int32_t));
  r.w = Allocate(tokens * kTopK * sizeof(float));
  return r;
}

MoeRoutingParams BenchRouting() {
  MoeRoutingParams p;
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.renormalize = true;
  return p;
}

absl::Status OldRouter(const Router& r, int64_t T, int i, GemmContext& gemm, CudaStream s) {
  float* logits = r.logits.as<float>();
  if (absl::Status st =
          gemm.Gemm(r.xb.as<Bf16>(), T, kHidden, r.At(i), kExperts, nullptr, logits, s);
      !st.ok()) {
    return st;
  }
  return MoeRoute(logits, T, BenchRouting(), r.ids.as<int32_t>(), r.w.as<float>(), s);
}

absl::Status FusedRouter(const Router& r, int64_t T, int i, bool programmatic, CudaStream s) {
  MoeRouterArgs a;
  a.residual = r.residual.as<float>();
  a.norm = r.norm.as<float>();
  a.num_tokens = T;
  a.hidden = kHidden;
  a.router = r.At(i);
  a.routing = BenchRouting();
  a.logits = r.logits.as<float>();
  a.counters = r.counters.as<int32_t>();
  a.experts = r.ids.as<int32_t>();
  a.weights = r.w.as<float>();
  a.programmatic = programmatic;
  return MoeRouteFromResidual(a, s);
}

absl::Status SplitRouter(const Router& r, int64_t T, int i, GemmContext& gemm, CudaStream s) {
  float* logits = r.logits.as<float>();
  if (absl::Status st = MoeRouterSplitInput(r.residual.as<float>(), r.norm.as<float>(), 1e-6f, T,
                                            kHidden, r.split.as<Bf16>(), s);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          gemm.Gemm(r.split.as<Bf16>(), 2 * T, kHidden, r.At(i), kExperts, nullptr, logits, s);
      !st.ok()) {
    return st;
  }
  return MoeRoute(logits, T, BenchRouting(), r.ids.as<int32_t>(), r.w.as<float>(), s,
                  logits + T * kExperts);
}

nlohmann::json RouterTimes(GemmContext& gemm, CudaStream s) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t T : {1, 8, 64, 4096}) {
    const Router r = MakeRouter(T, s);
    nlohmann::json j;
    j["tokens"] = T;
    j["old_gemm_bf16_xb_then_route_us"] =
        1e6 * TimeIt(s, [&](int i) { return OldRouter(r, T, i, gemm, s); });
    if (T <= kMoeFusedRouterMaxTokens) {
      j["fused_fp32_us"] = 1e6 * TimeIt(s, [&](int i) { return FusedRouter(r, T, i, false, s); });
      j["fused_fp32_programmatic_us"] =
          1e6 * TimeIt(s, [&](int i) { return FusedRouter(r, T, i, true, s); });
    }
    if (T >= kMoeFusedRouterMaxTokens) {
      j["split_fp32_us"] = 1e6 * TimeIt(s, [&](int i) { return SplitRouter(r, T, i, gemm, s); });
    }
    out.push_back(j);
  }
  return out;
}

// ---- pair GEMV schedules ----

nlohmann::json PairKernelTimes(const Step& st, const Layers& layers, double copy_bw, CudaStream s) {
  nlohmann::json out = nlohmann::json::array();
  DeviceBuffer act = Allocate(st.tokens * kTopK * kInter * sizeof(Bf16));
  const double bytes =
      static_cast<double>(st.selected_experts) * 3 * kInter * kHidden * sizeof(Bf16);
  {
    auto args = [&](int i) {
      return MoePairGemvArgs{
          st.x.as<Bf16>(), st.tokens, st.ids.as<int32_t>(), st.weights.as<float>(), kTopK, 0,
          layers.At(i),    nullptr,   act.as<Bf16>(),       st.out.as<Bf16>()};
    };
    nlohmann::json j;
    j["tokens"] = st.tokens;
    j["gate_up_us"] = 1e6 * TimeIt(s, [&](int i) { return MoePairGemvGateUp(args(i), s); });
    j["down_combine_us"] =
        1e6 * TimeIt(s, [&](int i) { return MoePairGemvDownCombine(args(i), s); });
    const double sec = TimeIt(s, [&](int i) {
      MoeExpertsArgs a =
          ExpertsArgs(st, layers.At(i), MoeExpertsPath::kGemvPairs, MoeGemmKernelKind::kAuto);
      return MoeExperts(a, s);
    });
    j["experts_us"] = sec * 1e6;
    j["fraction_of_copy_bw"] = bytes / sec / copy_bw;
    out.push_back(j);
  }
  return out;
}

// ---- one sparse layer at batch 1 ----

nlohmann::json LayerB1(const Layers& layers, GemmContext& gemm, double copy_bw, CudaStream s) {
  const Router r = MakeRouter(1, s);
  DeviceBuffer act = Allocate(kTopK * kInter * sizeof(Bf16));
  DeviceBuffer out = Allocate(kHidden * sizeof(Bf16));
  auto pairs = [&](int i) {
    const MoePairGemvArgs a{
        r.xb.as<Bf16>(), 1,       r.ids.as<int32_t>(), r.w.as<float>(), kTopK, 0,
        layers.At(i),    nullptr, act.as<Bf16>(),      out.as<Bf16>()};
    if (absl::Status st = MoePairGemvGateUp(a, s); !st.ok()) return st;
    return MoePairGemvDownCombine(a, s);
  };
  nlohmann::json j;
  const double old_sec = TimeIt(s, [&](int i) {
    if (absl::Status st = OldRouter(r, 1, i, gemm, s); !st.ok()) return st;
    return pairs(i);
  });
  const double new_sec = TimeIt(s, [&](int i) {
    if (absl::Status st = FusedRouter(r, 1, i, true, s); !st.ok()) return st;
    return pairs(i);
  });
  const double bytes = 8.0 * 3 * kInter * kHidden * sizeof(Bf16) + kExperts * kHidden * 2.0;
  j["old_us"] = old_sec * 1e6;
  j["new_us"] = new_sec * 1e6;
  j["bytes"] = bytes;
  j["old_fraction_of_copy_bw"] = bytes / old_sec / copy_bw;
  j["new_fraction_of_copy_bw"] = bytes / new_sec / copy_bw;
  j["ideal_us_at_copy_bw"] = bytes / copy_bw * 1e6;
  return j;
}

// The numbers to read first, one line each, on stderr.
void PrintSummary(const nlohmann::json& doc) {
  std::fprintf(stderr, "== router (us) ==\n");
  for (const nlohmann::json& j : doc["router"]) {
    std::fprintf(stderr, "T=%-5lld old %.2f", static_cast<long long>(j["tokens"].get<int64_t>()),
                 j["old_gemm_bf16_xb_then_route_us"].get<double>());
    for (const char* k : {"fused_fp32_us", "fused_fp32_programmatic_us", "split_fp32_us"}) {
      if (j.contains(k)) std::fprintf(stderr, "  %s %.2f", k, j[k].get<double>());
    }
    std::fprintf(stderr, "\n");
  }
  std::fprintf(stderr, "== pair kernels (us) ==\n");
  for (const nlohmann::json& j : doc["pair_kernels"]) {
    std::fprintf(stderr, "T=%lld gate_up %.2f down %.2f experts %.2f (%.0f%% of copy bw)\n",
                 static_cast<long long>(j["tokens"].get<int64_t>()), j["gate_up_us"].get<double>(),
                 j["down_combine_us"].get<double>(), j["experts_us"].get<double>(),
                 100 * j["fraction_of_copy_bw"].get<double>());
  }
  std::fprintf(stderr, "== gemv vs grouped gemm (us) ==\n");
  for (const nlohmann::json& j : doc["crossover"]) {
    std::fprintf(stderr, "T=%-4lld %-18s %.1f (%.0f%% of copy bw, %d experts)\n",
                 static_cast<long long>(j["tokens"].get<int64_t>()),
                 j["path"].get<std::string>().c_str(), j["us"].get<double>(),
                 100 * j["fraction_of_copy_bw"].get<double>(), j["selected_experts"].get<int>());
  }
  const nlohmann::json& l = doc["layer_b1"];
  std::fprintf(stderr, "== one sparse layer, b1 ==\nold %.2f us, new %.2f us, ideal %.2f us\n",
               l["old_us"].get<double>(), l["new_us"].get<double>(),
               l["ideal_us_at_copy_bw"].get<double>());
}

void Run() {
  BENCH_CHECK(SetDevice(0));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "cudaGetDeviceProperties failed\n");
    std::exit(1);
  }
  Stream stream = Must(Stream::Create(), "Stream::Create");
  CudaStream s = stream.get();
  const double copy_bw = CopyBandwidth(s);
  const Layers layers = RandomLayers(s);
  std::unique_ptr<GemmContext> gemm = Must(GemmContext::Create(), "GemmContext::Create");
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json routing = nlohmann::json::array();
  nlohmann::json pair_kernels = nlohmann::json::array();
  nlohmann::json crossover = nlohmann::json::array();
  for (int64_t tokens : {16, 32, 48, 64, 96, 128}) {
    const Step st = MakeStep(tokens, layers, s);
    for (MoeExpertsPath path : {MoeExpertsPath::kGemv, MoeExpertsPath::kGroupedGemm}) {
      nlohmann::json m = Measure(st, layers, path, MoeGemmKernelKind::kAuto, copy_bw, s);
      m.erase("stages");
      crossover.push_back(m);
    }
  }
  for (int64_t tokens : {1, 8, 64, 4096}) {
    const Step st = MakeStep(tokens, layers, s);
    const double route_sec = TimeIt(s, [&](int) {
      return MoeRoute(st.logits.as<float>(), tokens, st.routing, st.ids.as<int32_t>(),
                      st.weights.as<float>(), s);
    });
    routing.push_back({{"tokens", tokens}, {"us", route_sec * 1e6}});
    if (tokens <= 8) {
      for (const nlohmann::json& j : PairKernelTimes(st, layers, copy_bw, s)) {
        pair_kernels.push_back(j);
      }
      results.push_back(
          Measure(st, layers, MoeExpertsPath::kGemvPairs, MoeGemmKernelKind::kAuto, copy_bw, s));
    }
    if (tokens <= 64) {
      results.push_back(
          Measure(st, layers, MoeExpertsPath::kGemv, MoeGemmKernelKind::kAuto, copy_bw, s));
    }
    if (tokens >= 64) {
      for (MoeGemmKernelKind k : {MoeGemmKernelKind::kMmaSync, MoeGemmKernelKind::kAuto}) {
        results.push_back(Measure(st, layers, MoeExpertsPath::kGroupedGemm, k, copy_bw, s));
      }
    }
  }
  nlohmann::json doc;
  doc["bench"] = "moe_kernel_bench";
  doc["command"] = "moe_kernel_bench";
  doc["device"] = prop.name;
  doc["sm"] = prop.major * 10 + prop.minor;
  doc["shapes"] = {{"hidden", kHidden},
                   {"inter", kInter},
                   {"experts", kExperts},
                   {"top_k", kTopK},
                   {"layer_copies", kLayerCopies}};
  doc["copy_bytes_per_s"] = copy_bw;
  doc["auto_gemv_max_tokens"] = kMoeGemvMaxTokens;
  doc["routing"] = routing;
  doc["results"] = results;
  doc["router"] = RouterTimes(*gemm, s);
  doc["pair_kernels"] = pair_kernels;
  doc["crossover"] = crossover;
  doc["layer_b1"] = LayerB1(layers, *gemm, copy_bw, s);
  std::printf("%s\n", doc.dump(2).c_str());
  PrintSummary(doc);
}

}  // namespace
}  // namespace tessera::kernels::cuda

int main() {
  std::string why;
  if (tessera::kernels::cuda::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "moe_kernel_bench: no CUDA device: %s\n", why.c_str());
    return 1;
  }
  tessera::kernels::cuda::Run();
  return 0;
}
