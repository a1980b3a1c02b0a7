// How much GemmContext's tuning (kernels/cuda/gemm.h) leaves on the table
// for the decode GEMMs at m rows (default 64): Llama-3-8B's projections,
// whole and one rank's share at tensor-parallel size 2, in the layout
// gemm.cu uses (bf16, fp32 accumulation, bf16 out, no bias).
//
// Per shape:
// - every algorithm cuBLASLt's heuristic offers (asked for up to 256),
//   each timed after L2 flushes that read twice the L2 size (the tuner's
//   default) and after flushes that write it (memset, the former tuner):
//   the heuristic's first, the best and which one it is;
// - a search around the heuristic's offers: the first `--bases` offers
//   with every tile the algorithm lists, split-K 1, 2, 3, 4 or 6 and
//   custom options 0..7, each configuration cuBLASLt accepts timed twice
//   (up to --max_configs), the twelve fastest re-timed together with the
//   heuristic's best, interleaved, so both carry the same noise;
// - how much one configuration's time varies between two timings of it.
//
// Prints one JSON document on stdout. About a minute on an H200.
//
//   build/tests/bench/gemm_search_bench [--m=64] [--max_configs=4000] [--bases=2]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/gemm.h"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void CheckLt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLASLt status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

struct Bench {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  void *w = nullptr, *x = nullptr, *y = nullptr, *ws = nullptr, *flush = nullptr;
  size_t flush_bytes = 0;
  int flush_blocks = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  void Flush(bool read, int i) {
    if (read) {
      const absl::Status s = tessera::kernels::cuda::ReadThroughL2(flush, flush_bytes, flush_blocks,
                                                                   static_cast<int*>(ws), stream);
      if (!s.ok()) {
        std::fprintf(stderr, "flush: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    } else {
      Check(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream), "flush");
    }
  }

  // Mean µs of `reps` runs, each after a flush; -1 when cuBLASLt refuses.
  double Time(const cublasLtMatmulAlgo_t& algo, int reps, bool read_flush) {
    const float alpha = 1.f, beta = 0.f;
    auto run = [&] {
      return cublasLtMatmul(handle, desc, &alpha, w, a, x, b, &beta, y, d, y, d, &algo, ws,
                            kWorkspaceBytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) return -1;
    Check(cudaStreamSynchronize(stream), "warm-up");
    double total = 0;
    for (int i = 0; i < reps; ++i) {
      Flush(read_flush, i);
      Check(cudaEventRecord(start, stream), "record");
      if (run() != CUBLAS_STATUS_SUCCESS) return -1;
      Check(cudaEventRecord(stop, stream), "record");
      Check(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      total += ms;
    }
    return total / reps * 1e3;
  }
};

int ConfigAttr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  int v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return -1;
  }
  return v;
}

std::string ConfigJson(const cublasLtMatmulAlgo_t& algo) {
  return absl::StrCat("{\"id\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_ID),
                      ", \"tile\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                      ", \"stages\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                      ", \"split_k\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                      ", \"custom\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                      ", \"cluster\": ", ConfigAttr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                      "}");
}

std::vector<int> TileIds(const cublasLtMatmulAlgo_t& algo) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) !=
          CUBLAS_STATUS_SUCCESS ||
      bytes == 0) {
    return {};
  }
  std::vector<int> ids(bytes / sizeof(int));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, ids.data(), bytes,
                                        &bytes) != CUBLAS_STATUS_SUCCESS) {
    return {};
  }
  return ids;
}

int Flag(int argc, char** argv, const char* name, int def) {
  const size_t len = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
      return std::atoi(argv[i] + len + 1);
    }
  }
  return def;
}

std::string Num(double v) { return absl::StrCat(std::round(v * 100) / 100); }

}  // namespace

int main(int argc, char** argv) {
  const int m = Flag(argc, argv, "--m", 64);
  const int max_configs = Flag(argc, argv, "--max_configs", 4000);
  const int bases = Flag(argc, argv, "--bases", 2);
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096},          {"o_proj", 4096, 4096},
                          {"gate_up", 28672, 4096},     {"down", 4096, 14336},
                          {"qkv_tp2", 3072, 4096},      {"o_proj_tp2", 4096, 2048},
                          {"gate_up_tp2", 14336, 4096}, {"down_tp2", 4096, 7168}};
  Bench bench;
  CheckLt(cublasLtCreate(&bench.handle), "cublasLtCreate");
  Check(cudaStreamCreate(&bench.stream), "stream");
  Check(cudaEventCreate(&bench.start), "event");
  Check(cudaEventCreate(&bench.stop), "event");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "properties");
  bench.flush_bytes = 2 * static_cast<size_t>(prop.l2CacheSize) / 16 * 16;
  bench.flush_blocks = prop.multiProcessorCount * 4;
  Check(cudaMalloc(&bench.flush, bench.flush_bytes), "malloc");
  Check(cudaMemset(bench.flush, 0, bench.flush_bytes), "memset");
  Check(cudaMalloc(&bench.ws, kWorkspaceBytes), "malloc");
  size_t w_max = 0, x_max = 0, y_max = 0;
  for (const Shape& s : shapes) {
    w_max = std::max(w_max, static_cast<size_t>(s.n) * s.k * 2);
    x_max = std::max(x_max, static_cast<size_t>(m) * s.k * 2);
    y_max = std::max(y_max, static_cast<size_t>(m) * s.n * 2);
  }
  Check(cudaMalloc(&bench.w, w_max), "malloc");
  Check(cudaMemset(bench.w, 0x3b, w_max), "memset");
  Check(cudaMalloc(&bench.x, x_max), "malloc");
  Check(cudaMemset(bench.x, 0x3c, x_max), "memset");
  Check(cudaMalloc(&bench.y, y_max), "malloc");

  std::vector<std::string> rows;
  for (const Shape& s : shapes) {
    CheckLt(cublasLtMatmulDescCreate(&bench.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CheckLt(cublasLtMatmulDescSetAttribute(bench.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t,
                                           sizeof(op_t)),
            "transa");
    CheckLt(cublasLtMatmulDescSetAttribute(bench.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n,
                                           sizeof(op_n)),
            "transb");
    CheckLt(cublasLtMatrixLayoutCreate(&bench.a, CUDA_R_16BF, s.k, s.n, s.k), "layout");
    CheckLt(cublasLtMatrixLayoutCreate(&bench.b, CUDA_R_16BF, s.k, m, s.k), "layout");
    CheckLt(cublasLtMatrixLayoutCreate(&bench.d, CUDA_R_16BF, s.n, m, s.n), "layout");
    cublasLtMatmulPreference_t pref = nullptr;
    CheckLt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws_bytes = kWorkspaceBytes;
    CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes, sizeof(ws_bytes)),
            "workspace");
    std::vector<cublasLtMatmulHeuristicResult_t> offers(256);
    int found = 0;
    CheckLt(cublasLtMatmulAlgoGetHeuristic(bench.handle, bench.desc, bench.a, bench.b, bench.d,
                                           bench.d, pref, 256, offers.data(), &found),
            "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    offers.resize(found);
    const double weight_mb = static_cast<double>(s.n) * s.k * 2 / 1e6;

    std::string row =
        absl::StrCat("{\"shape\": \"", s.name, "\", \"m\": ", m, ", \"n\": ", s.n, ", \"k\": ", s.k,
                     ", \"weight_mb\": ", Num(weight_mb), ", \"heuristic_offers\": ", found);
    int best_read = -1;
    for (const bool read : {true, false}) {
      std::vector<std::string> times;
      int best = -1;
      double best_us = 0;
      for (int i = 0; i < found; ++i) {
        const double us = bench.Time(offers[i].algo, 5, read);
        times.push_back(Num(us));
        if (us > 0 && (best < 0 || us < best_us)) {
          best = i;
          best_us = us;
        }
      }
      if (read) best_read = best;
      absl::StrAppend(&row, ", \"", read ? "read_flush" : "write_flush", "\": {\"us\": [",
                      absl::StrJoin(times, ", "), "], \"pick\": ", best,
                      ", \"pick_us\": ", Num(best_us),
                      ", \"pick_tb_per_s\": ", Num(weight_mb / best_us), "}");
    }
    if (best_read < 0) {
      std::fprintf(stderr, "%s: no offer could be timed\n", s.name);
      return 1;
    }

    // The search around the offers.
    struct Candidate {
      double us;
      cublasLtMatmulAlgo_t algo;
    };
    std::vector<Candidate> timed;
    int checked = 0, accepted = 0, timed_count = 0;
    for (int base = 0; base < std::min(found, bases); ++base) {
      for (const int tile : TileIds(offers[base].algo)) {
        for (const int split : {1, 2, 3, 4, 6}) {
          for (int custom = 0; custom <= 7 && accepted < max_configs; ++custom) {
            cublasLtMatmulAlgo_t algo = offers[base].algo;
            const int scheme = split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : 0;
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                 sizeof(tile));
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                 sizeof(split));
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &scheme, sizeof(scheme));
            cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom,
                                                 sizeof(custom));
            ++checked;
            cublasLtMatmulHeuristicResult_t check{};
            if (cublasLtMatmulAlgoCheck(bench.handle, bench.desc, bench.a, bench.b, bench.d,
                                        bench.d, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
                check.workspaceSize > kWorkspaceBytes) {
              continue;
            }
            ++accepted;
            const double us = bench.Time(algo, 2, true);
            if (us > 0) {
              timed.push_back({us, algo});
              ++timed_count;
            }
          }
        }
      }
    }
    std::sort(timed.begin(), timed.end(),
              [](const Candidate& l, const Candidate& r) { return l.us < r.us; });
    timed.resize(std::min<size_t>(timed.size(), 12));
    // Re-time the twelve and the heuristic's best, interleaved.
    std::vector<double> again(timed.size(), 0);
    double offer_again = 0, offer_first = 0, offer_second = 0;
    constexpr int kRounds = 4;
    for (int round = 0; round < kRounds; ++round) {
      const double t = bench.Time(offers[best_read].algo, 3, true);
      offer_again += t / kRounds;
      (round % 2 == 0 ? offer_first : offer_second) += t / (kRounds / 2);
      for (size_t i = 0; i < timed.size(); ++i) {
        again[i] += bench.Time(timed[i].algo, 3, true) / kRounds;
      }
    }
    size_t best = 0;
    for (size_t i = 1; i < again.size(); ++i) {
      if (again[i] < again[best]) best = i;
    }
    absl::StrAppend(&row, ", \"search\": {\"checked\": ", checked, ", \"accepted\": ", accepted,
                    ", \"timed\": ", timed_count, ", \"offer_pick_us\": ", Num(offer_again),
                    ", \"offer_pick_halves_us\": [", Num(offer_first), ", ", Num(offer_second),
                    "], \"offer_pick\": ", ConfigJson(offers[best_read].algo));
    if (!timed.empty()) {
      absl::StrAppend(&row, ", \"best_us\": ", Num(again[best]),
                      ", \"best\": ", ConfigJson(timed[best].algo),
                      ", \"best_vs_offer\": ", Num(again[best] / offer_again));
    }
    rows.push_back(row + "}}");
    std::fprintf(stderr, "%s done\n", s.name);
    cublasLtMatrixLayoutDestroy(bench.a);
    cublasLtMatrixLayoutDestroy(bench.b);
    cublasLtMatrixLayoutDestroy(bench.d);
    cublasLtMatmulDescDestroy(bench.desc);
  }
  std::printf(
      "{\"benchmark\": \"gemm_search\", \"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, "
      "\"results\": [\n  %s\n]}\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize, absl::StrJoin(rows, ",\n  ").c_str());
  return 0;
}
