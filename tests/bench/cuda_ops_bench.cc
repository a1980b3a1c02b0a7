// Microbenchmark of the CUDA kernels: bf16 GEMM throughput (TFLOP/s) for
// Llama-3-8B shapes (whole and one rank's share at tensor-parallel size 2) at
// m in {1..8, 64, 4096} (m <= 8 both through the GEMV
// kernel and through cuBLASLt; m = 64 also with the algorithm tuned per
// shape, after L2 flushes that read it), with
// achieved bandwidth as a fraction of the H200's 4.27 TB/s for m <= 8, and
// bandwidth of rmsnorm,
// fused-add rmsnorm, silu_mul, a sweep of forced GEMV split counts, plus
// the time of sampling / argmax / top-one over a 128256-entry vocabulary. Prints one
// JSON document on stdout.
//
// Weights are cycled over enough copies (>= 256 MiB in all) that a GEMV
// reads them from HBM, not from the 50 MiB L2. Runs in well under 60 s on
// an H200.
//
//   build-cudaops/tests/bench/cuda_ops_bench > cuda_ops.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/silu_mul.h"
#include "kernels/cuda/top_one.h"

namespace tessera::kernels::cuda {
namespace {

constexpr double kHbmBytesPerSecond = 4.27e12;  // H200 HBM3e

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

DeviceBuffer Filled(size_t bytes, int byte) {
  DeviceBuffer b = Must(DeviceBuffer::Allocate(bytes), "Allocate");
  BENCH_CHECK(MemsetDevice(b.data(), byte, bytes));
  return b;
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
  std::unique_ptr<GemmContext> gemm = Must(GemmContext::Create(), "GemmContext::Create");
  // m = 64 also through a context that tunes cuBLASLt's algorithm per shape.
  std::unique_ptr<GemmContext> tuned = Must(GemmContext::Create(), "GemmContext::Create");
  tuned->SetAutotune(64);
  std::vector<std::string> entries;

  // ---- GEMM ----
  struct NK {
    const char* name;
    int64_t n, k;
  };
  const NK shapes[] = {{"o_proj", 4096, 4096},
                       {"qkv", 6144, 4096},
                       {"gate_up", 28672, 4096},
                       {"down", 4096, 14336},
                       {"lm_head", 128256, 4096},
                       // One rank's share at tensor-parallel size 2.
                       {"o_proj_tp2", 4096, 2048},
                       {"qkv_tp2", 3072, 4096},
                       {"gate_up_tp2", 14336, 4096},
                       {"down_tp2", 4096, 7168},
                       {"lm_head_tp2", 64128, 4096}};
  // m <= 8 runs twice: through the GEMV kernel (GemmContext's default for
  // those shapes) and through cuBLASLt (SetUseGemv(false)).
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 64, 4096};
  DeviceBuffer x = Filled(4096 * 14336 * 2, 0x3c);
  DeviceBuffer y = Filled(4096 * 128256 * 2, 0);
  for (const NK& sh : shapes) {
    const size_t w_bytes = static_cast<size_t>(sh.n * sh.k * 2);
    const int copies =
        static_cast<int>(std::max<size_t>(1, ((256u << 20) + w_bytes - 1) / w_bytes));
    std::vector<DeviceBuffer> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(Filled(w_bytes, 0x3b));
    for (int64_t m : ms) {
      // GEMV, cuBLASLt, cuBLASLt tuned
      for (const int variant : {0, 1, 2}) {
        const bool use_gemv = variant == 0;
        if (variant == 1 && m > kGemvMaxRows) continue;
        if (variant >= 2 && m != 64) continue;
        gemm->SetUseGemv(use_gemv);
        GemmContext* ctx = variant == 2 ? tuned.get() : gemm.get();
        const double sec = TimeIt(s, [&](int i) {
          return ctx->Gemm(x.as<Bf16>(), m, sh.k, ws[i % copies].as<Bf16>(), sh.n, nullptr,
                           y.as<Bf16>(), s);
        });
        const double flops = 2.0 * m * sh.n * sh.k;
        const double bytes = static_cast<double>(w_bytes) + 2.0 * m * sh.k + 2.0 * m * sh.n;
        const char* path = variant == 2                    ? "cublaslt_tuned"
                           : m > kGemvMaxRows || !use_gemv ? "cublaslt"
                                                           : "gemv";
        std::string e = absl::StrCat(
            "{\"op\": \"gemm_bf16\", \"shape\": \"", sh.name, "\", \"path\": \"", path,
            "\", \"m\": ", m, ", \"n\": ", sh.n, ", \"k\": ", sh.k, ", \"us\": ", sec * 1e6,
            ", \"tflops\": ", flops / sec * 1e-12, ", \"gb_per_s\": ", bytes / sec * 1e-9);
        if (m <= kGemvMaxRows) {
          absl::StrAppend(&e, ", \"fraction_of_hbm\": ", bytes / sec / kHbmBytesPerSecond);
        }
        if (use_gemv && m <= kGemvMaxRows) {
          GemvWorkspace probe;  // the split count the context's workspace gives
          probe.num_sms = prop.multiProcessorCount;
          BENCH_CHECK(GemvResidentCtasPerSm(&probe.ctas_per_sm));
          probe.partials = reinterpret_cast<float*>(16);
          probe.partial_capacity = kGemvPartialFloats;
          probe.counters = reinterpret_cast<uint32_t*>(16);
          probe.counter_capacity = kGemvCounters;
          absl::StrAppend(&e, ", \"splits\": ", GemvSplits(m, sh.n, sh.k, probe));
        }
        entries.push_back(e + "}");
      }
    }
  }
  gemm->SetUseGemv(true);

  // ---- RMSNorm then a projection of its output, m = 1: the staged GEMV
  // (its weight copies overlapping the norm) against what Gemm() runs (the
  // tiled GEMV or cuBLASLt), with the staged kernel's CTAs per SM; data
  // for GemmContext::StagedTakes ----
  if (GemvStagedSupported()) {
    DeviceBuffer norm_in = Filled(4096 * 4, 0);
    DeviceBuffer norm_w = Filled(4096 * 4, 0);
    for (const NK& sh : shapes) {
      if (sh.k > kStagedMaxK || sh.n > 32768) continue;
      const size_t w_bytes = static_cast<size_t>(sh.n * sh.k * 2);
      const int copies =
          static_cast<int>(std::max<size_t>(1, ((256u << 20) + w_bytes - 1) / w_bytes));
      std::vector<DeviceBuffer> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(Filled(w_bytes, 0x3b));
      int staged_ctas = 0;
      BENCH_CHECK(GemvStagedResidentCtasPerSm(1, sh.k, &staged_ctas));
      for (const bool staged : {false, true}) {
        const double sec = TimeIt(s, [&](int i) {
          BENCH_CHECK(
              RmsNorm(norm_in.as<float>(), 1, sh.k, norm_w.as<float>(), 1e-5f, x.as<Bf16>(), s));
          const Bf16* w = ws[i % copies].as<Bf16>();
          return staged ? GemvStagedBf16(x.as<Bf16>(), 1, sh.k, w, sh.n, nullptr, y.as<Bf16>(), s)
                        : gemm->Gemm(x.as<Bf16>(), 1, sh.k, w, sh.n, nullptr, y.as<Bf16>(), s);
        });
        const bool gemv = sh.n * sh.k <= kGemvDefaultMaxWeightElems;
        entries.push_back(absl::StrCat(
            "{\"op\": \"rmsnorm_then_gemm\", \"shape\": \"", sh.name, "\", \"path\": \"",
            staged ? "staged"
            : gemv ? "gemv"
                   : "cublaslt",
            "\", \"m\": 1, \"n\": ", sh.n, ", \"k\": ", sh.k, ", \"us\": ", sec * 1e6,
            ", \"staged_ctas\": ", sh.n / 8,
            ", \"staged_slots\": ", staged_ctas * prop.multiProcessorCount,
            ", \"staged_taken\": ", gemm->StagedTakes(1, sh.n, sh.k) ? "true" : "false", "}"));
      }
    }
  }

  // ---- GEMV split sweep (m = 1): data for the split rule ----
  {
    DeviceBuffer partials = Filled(kGemvPartialFloats * sizeof(float), 0);
    DeviceBuffer counters = Filled(kGemvCounters * sizeof(uint32_t), 0);
    GemvWorkspace gws;
    gws.partials = partials.as<float>();
    gws.partial_capacity = kGemvPartialFloats;
    gws.counters = counters.as<uint32_t>();
    gws.counter_capacity = kGemvCounters;
    gws.num_sms = prop.multiProcessorCount;
    BENCH_CHECK(GemvResidentCtasPerSm(&gws.ctas_per_sm));
    for (const NK& sh : shapes) {
      if (sh.n > 32768) continue;  // not the LM head
      const size_t w_bytes = static_cast<size_t>(sh.n * sh.k * 2);
      const int copies = static_cast<int>(((256u << 20) + w_bytes - 1) / w_bytes);
      std::vector<DeviceBuffer> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(Filled(w_bytes, 0x3b));
      for (int splits : {1, 2, 3, 4, 6, 8}) {
        const double sec = TimeIt(s, [&](int i) {
          return GemvBf16(x.as<Bf16>(), 1, sh.k, ws[i % copies].as<Bf16>(), sh.n, nullptr,
                          y.as<Bf16>(), gws, s, splits);
        });
        const double bytes = static_cast<double>(w_bytes) + 2.0 * sh.k + 2.0 * sh.n;
        entries.push_back(absl::StrCat(
            "{\"op\": \"gemv_split_sweep\", \"shape\": \"", sh.name, "\", \"m\": 1, \"n\": ", sh.n,
            ", \"k\": ", sh.k, ", \"splits\": ", GemvSplits(1, sh.n, sh.k, gws, splits),
            ", \"auto_splits\": ", GemvSplits(1, sh.n, sh.k, gws),
            ", \"ctas_per_sm\": ", gws.ctas_per_sm, ", \"us\": ", sec * 1e6,
            ", \"fraction_of_hbm\": ", bytes / sec / kHbmBytesPerSecond, "}"));
      }
    }
  }
  y = DeviceBuffer();

  // ---- rmsnorm / fused add rmsnorm / silu_mul ----
  const int64_t hidden = 4096, inter = 14336;
  DeviceBuffer norm_w = Filled(hidden * 4, 0);
  DeviceBuffer act = Filled(4096 * hidden * 4, 0x3c);
  DeviceBuffer delta = Filled(4096 * hidden * 2, 0x3c);
  DeviceBuffer out = Filled(4096 * inter * 2, 0);
  DeviceBuffer gate_up = Filled(4096 * 2 * inter * 2, 0x3c);
  for (int64_t rows : {1, 128, 4096}) {
    double sec = TimeIt(s, [&](int) {
      return RmsNorm(act.as<float>(), rows, hidden, norm_w.as<float>(), 1e-5f, out.as<Bf16>(), s);
    });
    double bytes = rows * hidden * (4.0 + 2.0) + hidden * 4.0;
    entries.push_back(absl::StrCat("{\"op\": \"rmsnorm\", \"rows\": ", rows, ", \"cols\": ", hidden,
                                   ", \"us\": ", sec * 1e6, ", \"gb_per_s\": ", bytes / sec * 1e-9,
                                   ", \"fraction_of_hbm\": ", bytes / sec / kHbmBytesPerSecond,
                                   "}"));
    sec = TimeIt(s, [&](int) {
      return FusedAddRmsNorm(delta.as<Bf16>(), act.as<float>(), rows, hidden, norm_w.as<float>(),
                             1e-5f, out.as<Bf16>(), s);
    });
    bytes = rows * hidden * (2.0 + 4.0 + 4.0 + 2.0) + hidden * 4.0;
    entries.push_back(
        absl::StrCat("{\"op\": \"fused_add_rmsnorm\", \"rows\": ", rows, ", \"cols\": ", hidden,
                     ", \"us\": ", sec * 1e6, ", \"gb_per_s\": ", bytes / sec * 1e-9,
                     ", \"fraction_of_hbm\": ", bytes / sec / kHbmBytesPerSecond, "}"));
    sec =
        TimeIt(s, [&](int) { return SiluMul(gate_up.as<Bf16>(), rows, inter, out.as<Bf16>(), s); });
    bytes = rows * inter * (4.0 + 2.0);
    entries.push_back(
        absl::StrCat("{\"op\": \"silu_mul\", \"rows\": ", rows, ", \"inter\": ", inter,
                     ", \"us\": ", sec * 1e6, ", \"gb_per_s\": ", bytes / sec * 1e-9,
                     ", \"fraction_of_hbm\": ", bytes / sec / kHbmBytesPerSecond, "}"));
  }

  // ---- argmax / sampling over a Llama-3 vocabulary ----
  const int64_t vocab = 128256;
  for (int64_t rows : {1, 64}) {
    std::vector<float> logits(rows * vocab);
    uint32_t st = 12345;
    for (float& v : logits) {
      st = st * 1664525u + 1013904223u;
      v = static_cast<float>(st >> 8) / (1 << 24) * 20.0f - 10.0f;
    }
    DeviceBuffer d_logits = Must(DeviceBuffer::Allocate(logits.size() * 4), "Allocate");
    BENCH_CHECK(CopyToDevice(d_logits.data(), logits.data(), logits.size() * 4, s));
    DeviceBuffer tokens = Filled(rows * 4, 0);
    double sec = TimeIt(s, [&](int) {
      return ArgmaxRows(d_logits.as<float>(), rows, vocab, tokens.as<int32_t>(), s);
    });
    entries.push_back(absl::StrCat("{\"op\": \"argmax\", \"rows\": ", rows, ", \"vocab\": ", vocab,
                                   ", \"us\": ", sec * 1e6, "}"));
    // The (value, id) form the tensor-parallel ranks combine.
    DeviceBuffer top_values = Filled(rows * 4, 0);
    DeviceBuffer top_ws = Filled(TopOneWorkspaceBytes(rows), 0);
    sec = TimeIt(s, [&](int) {
      return TopOneRows(d_logits.as<float>(), rows, vocab, 0, tokens.as<int32_t>(),
                        top_values.as<float>(), top_ws.data(), top_ws.size(), s);
    });
    entries.push_back(absl::StrCat("{\"op\": \"top_one\", \"rows\": ", rows, ", \"vocab\": ", vocab,
                                   ", \"us\": ", sec * 1e6, "}"));
    struct Mode {
      const char* name;
      RowSamplingParams p;
    };
    Mode modes[3];
    modes[0] = {"temperature", {}};
    modes[1] = {"top_k50_top_p0.9", {}};
    modes[1].p.top_k = 50;
    modes[1].p.top_p = 0.9f;
    modes[2] = {"top_p0.9_min_p0.05", {}};
    modes[2].p.top_p = 0.9f;
    modes[2].p.min_p = 0.05f;
    for (const Mode& mode : modes) {
      std::vector<RowSamplingParams> params(rows, mode.p);
      for (int64_t r = 0; r < rows; ++r) params[r].position = r;
      DeviceBuffer d_params = Must(DeviceBuffer::Allocate(rows * sizeof(RowSamplingParams)), "A");
      BENCH_CHECK(
          CopyToDevice(d_params.data(), params.data(), rows * sizeof(RowSamplingParams), s));
      BENCH_CHECK(Synchronize(s));
      const size_t ws_bytes = SampleRowsWorkspaceBytes(rows, vocab);
      DeviceBuffer ws = Must(DeviceBuffer::Allocate(ws_bytes), "Allocate");
      sec = TimeIt(s, [&](int) {
        return SampleRows(d_logits.as<float>(), rows, vocab, d_params.as<RowSamplingParams>(),
                          tokens.as<int32_t>(), ws.data(), ws_bytes, s);
      });
      entries.push_back(absl::StrCat("{\"op\": \"sample\", \"mode\": \"", mode.name,
                                     "\", \"rows\": ", rows, ", \"vocab\": ", vocab,
                                     ", \"us\": ", sec * 1e6, "}"));
    }
  }

  std::printf("{\n  \"device\": \"%s\",\n  \"sm\": %d%d,\n  \"hbm_reference_bytes_per_s\": %.3g,\n",
              prop.name, prop.major, prop.minor, kHbmBytesPerSecond);
  std::printf("  \"results\": [\n");
  for (size_t i = 0; i < entries.size(); ++i) {
    std::printf("    %s%s\n", entries[i].c_str(), i + 1 < entries.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

}  // namespace
}  // namespace tessera::kernels::cuda

int main() {
  std::string why;
  if (tessera::kernels::cuda::CudaDeviceCount(&why) == 0) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device: %s\n", why.c_str());
    return 1;
  }
  tessera::kernels::cuda::Run();
  return 0;
}
