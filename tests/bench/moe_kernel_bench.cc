// Microbenchmark of the CUDA mixture-of-experts kernels at Qwen3-30B-A3B
// shapes (hidden 2048, 128 experts, top-8, expert width 768), random bf16
// weights and random router logits (softmax top-8, renormalised):
//   - the whole routed-expert block (MoeExperts: grouping, gate/up +
//     SiLU-mul, down, combine) at T = 1, 8 through the pair-major GEMVs
//     (no grouping, down fused with the combine), T = 1, 8, 64 through the
//     grouped GEMVs and
//     T = 64, 4096 through the grouped GEMM (its mma.sync kernel and the
//     default, wgmma on SM 9.0), and each stage alone;
//   - routing (MoeRoute) at every T.
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
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_grouping.h"
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
  const double sec =
      TimeIt(s, [&](int i) { return MoeExperts(ExpertsArgs(st, layers.At(i), path, kernel), s); });
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
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json routing = nlohmann::json::array();
  for (int64_t tokens : {1, 8, 64, 4096}) {
    const Step st = MakeStep(tokens, layers, s);
    const double route_sec = TimeIt(s, [&](int) {
      return MoeRoute(st.logits.as<float>(), tokens, st.routing, st.ids.as<int32_t>(),
                      st.weights.as<float>(), s);
    });
    routing.push_back({{"tokens", tokens}, {"us", route_sec * 1e6}});
    if (tokens <= 8) {
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
  std::printf("%s\n", doc.dump(2).c_str());
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
