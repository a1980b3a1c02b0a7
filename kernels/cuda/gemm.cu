// cuBLASLt GEMM (see gemm.h).
//
// Row-major y[m, n] = x[m, k] W[n, k]^T is, in cuBLASLt's column-major
// terms, D[n, m] = op(A)[n, k] B[k, m] with A = W viewed as column-major
// [k, n] (lda = k, op = T), B = x viewed as [k, m] (ldb = k, op = N) and
// D = y viewed as [n, m] (ldd = n). The bias epilogue adds bias[n] along D's
// rows, i.e. per output feature.
#include <cublasLt.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_libraries.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"

namespace tessera::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kAutotuneReps = 5;
constexpr size_t kScratchBytes = 32u << 20;

absl::Status LtError(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string load = LastCudaLibraryError();
  if (!load.empty()) {
    return absl::InternalError(absl::StrCat(std::string(what), ": ", load));
  }
  return absl::InternalError(absl::StrCat(std::string(what), ": ", cublasLtGetStatusName(st), " (",
                                          cublasLtGetStatusString(st), ")"));
}

#define TESSERA_LT_RETURN_IF_ERROR(expr)           \
  do {                                             \
    const cublasStatus_t tessera_lt_st_ = (expr);  \
    if (tessera_lt_st_ != CUBLAS_STATUS_SUCCESS) { \
      return LtError(tessera_lt_st_, #expr);       \
    }                                              \
  } while (0)

// Largest power of two <= 16 dividing the address.
int AlignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int b = 16; b > 1; b /= 2) {
    if (a % b == 0) return b;
  }
  return 1;
}

// fp32 GEMM result (+ bias when the epilogue did not add it) -> bf16, one
// rounding.
__global__ void RoundToBf16Kernel(const float* __restrict__ src, int64_t m, int64_t n,
                                  const float* __restrict__ bias, uint16_t* __restrict__ y) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = FloatToBf16Bits(bias != nullptr ? src[i] + bias[i % n] : src[i]);
  }
}

__global__ void AddBiasF32Kernel(float* __restrict__ y, int64_t m, int64_t n,
                                 const float* __restrict__ bias) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % n];
  }
}

// Reads `n` 16-byte words through L2 (not L1), so that L2 ends up holding
// clean lines of this buffer only: the tuner's flush before each timed
// GEMM. `sink` is written only for a value the buffer (zeros) never sums
// to, which keeps the loads.
__global__ void ReadThroughL2Kernel(const int4* __restrict__ p, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x5eed5eed) *sink = acc;
}

unsigned ElementwiseBlocks(int64_t total, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65535 * 8));
}

}  // namespace

absl::Status ReadThroughL2(const void* buf, size_t bytes, int blocks, int* sink,
                           CudaStream stream) {
  if (buf == nullptr || sink == nullptr || bytes % 16 != 0 || blocks < 1) {
    return absl::InvalidArgumentError(
        "ReadThroughL2: needs a buffer, a sink, a multiple of 16 bytes and a block");
  }
  ReadThroughL2Kernel<<<blocks, 512, 0, AsCuda(stream)>>>(static_cast<const int4*>(buf),
                                                          static_cast<int64_t>(bytes / 16), sink);
  return CheckLastLaunch("ReadThroughL2");
}

// Key: m, n, k, fp32 output, bias, alignments of x, w, y, bias.
using GemmKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, int, int>;

struct GemmTuningTable::Impl {
  struct Entry {
    bool done = false;   // the tuning context has finished
    bool found = false;  // and timed at least one candidate
    cublasLtMatmulAlgo_t algo{};
  };
  std::mutex mu;
  std::condition_variable cv;
  // (shape, bias in the epilogue) -> the pick.
  std::map<std::pair<GemmKey, bool>, Entry> entries;
  TestOutcome next_outcome = TestOutcome::kPick;  // SetNextOutcomeForTest
};

GemmTuningTable::GemmTuningTable() : impl_(std::make_unique<Impl>()) {}
GemmTuningTable::~GemmTuningTable() = default;

void GemmTuningTable::SetNextOutcomeForTest(TestOutcome outcome) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->next_outcome = outcome;
}

namespace {

// An algorithm set up for an fp64 GEMM, which cuBLASLt refuses for the
// bf16 operations here (SetNextOutcomeForTest); zeros where no fp64
// algorithm can be set up.
cublasLtMatmulAlgo_t Fp64Algo(cublasLtHandle_t handle) {
  cublasLtMatmulAlgo_t algo{};
  int id = 0, found = 0;
  if (cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F,
                               CUDA_R_64F, CUDA_R_64F, 1, &id, &found) == CUBLAS_STATUS_SUCCESS &&
      found == 1) {
    cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F,
                           CUDA_R_64F, CUDA_R_64F, id, &algo);
  }
  return algo;
}

}  // namespace

struct GemmContext::Impl {
  using Key = GemmKey;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool bias_in_epilogue = false;  // false with bias: separate bias kernel
    // The heuristic's candidates (best first; algo is the first) until the
    // plan is tuned.
    std::vector<cublasLtMatmulAlgo_t> candidates;
    bool tuned = false;
  };

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  void* scratch = nullptr;  // fp32 result of biased bf16 GEMMs (kScratchBytes)
  GemvWorkspace gemv;       // split-K partials and counters of the m <= 8 kernel
  bool use_gemv = true;
  bool staged_supported = false;  // GemvStagedSupported() on the context's device
  int64_t gemv_max_weight_elems = kGemvDefaultMaxWeightElems;
  int64_t autotune_max_m = 0;                         // SetAutotune
  int autotune_candidates = kGemmAutotuneCandidates;  // SetAutotuneCandidates
  std::shared_ptr<GemmTuningTable> tuning;            // ShareTuning
  int shapes_timed = 0;
  int picks_refused = 0;  // shared picks cublasLtMatmulAlgoCheck refused
  // The L2 flush buffer of tuning (2 x L2), allocated by the first shape
  // timed in an autotune window and freed when the window closes, so that
  // serving does not keep it; flush_tried: allocated or failed this window.
  void* flush = nullptr;
  size_t flush_bytes = 0;
  bool flush_tried = false;
  int flush_blocks = 0;  // SMs x 4 for the read

  void FreeFlush() {
    if (flush != nullptr) cudaFree(flush);
    flush = nullptr;
    flush_bytes = 0;
    flush_tried = false;
  }
  std::mutex mu;
  std::map<Key, Plan> plans;
  std::map<std::pair<int64_t, int64_t>, int> staged_ctas_per_sm;  // (m, k) -> CTAs

  bool StagedTakesLocked(int64_t m, int64_t n, int64_t k) {
    // One row only (every CTA copies all of x); one wave of CTAs, or a
    // weight Gemm() would send to cuBLASLt (GemmContext::StagedTakes says
    // why).
    if (!use_gemv || !gemv.staged || m != 1 || n <= 0 || n % 8 != 0 || k <= 0 || k % 128 != 0 ||
        k > kStagedMaxK) {
      return false;
    }
    auto it = staged_ctas_per_sm.find({m, k});
    if (it == staged_ctas_per_sm.end()) {
      int ctas = 0;
      if (!GemvStagedResidentCtasPerSm(m, k, &ctas).ok()) ctas = 0;
      it = staged_ctas_per_sm.emplace(std::make_pair(m, k), ctas).first;
    }
    // No resident CTA: the device cannot hold the staged kernel's shared
    // memory for this k.
    if (it->second == 0) return false;
    return n / 8 <= static_cast<int64_t>(it->second) * gemv.num_sms ||
           n * k > gemv_max_weight_elems;
  }

  ~Impl() {
    for (auto& [key, plan] : plans) Destroy(plan);
    if (workspace != nullptr) cudaFree(workspace);
    if (scratch != nullptr) cudaFree(scratch);
    if (gemv.partials != nullptr) cudaFree(gemv.partials);
    if (gemv.counters != nullptr) cudaFree(gemv.counters);
    FreeFlush();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  static void Destroy(Plan& p) {
    if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
    if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
    if (p.d != nullptr) cublasLtMatrixLayoutDestroy(p.d);
    p = Plan{};
  }

  // Builds descriptors and asks the heuristic; `epilogue_bias` selects the
  // fused bias epilogue (fp32 bias vector).
  absl::Status Build(const Key& key, bool epilogue_bias, Plan* plan) {
    const auto [m, n, k, f32_out, has_bias, al_x, al_w, al_y, al_bias] = key;
    const cudaDataType_t d_type = f32_out ? CUDA_R_32F : CUDA_R_16BF;
    TESSERA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    if (epilogue_bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      const cudaDataType_t bias_type = CUDA_R_32F;
      TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k));
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k));
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->d, d_type, n, m, n));

    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t ax = al_x, aw = al_w, ay = al_y;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &aw, sizeof(aw));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &ax, sizeof(ax));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &ay, sizeof(ay));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &ay, sizeof(ay));
    }
    std::vector<cublasLtMatmulHeuristicResult_t> results(autotune_candidates);
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                          pref, autotune_candidates, results.data(), &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    TESSERA_LT_RETURN_IF_ERROR(st);
    if (found == 0) {
      return absl::InternalError(
          absl::StrCat("cuBLASLt offers no algorithm for bf16 GEMM m=", m, " n=", n, " k=", k));
    }
    plan->algo = results[0].algo;
    plan->candidates.clear();
    for (int i = 0; i < found && found > 1; ++i) plan->candidates.push_back(results[i].algo);
    plan->tuned = found == 1;
    plan->bias_in_epilogue = epilogue_bias;
    (void)al_bias;
    return absl::OkStatus();
  }

  // Times the plan's candidates on this call's operands (each once to warm
  // up, then kAutotuneReps times, each between two events after an L2
  // flush) and keeps the fastest;
  // a candidate cuBLASLt refuses here is skipped. During stream capture
  // nothing can be timed: the heuristic's first choice stays, for good, so
  // that graphs and eager calls of a shape run the same algorithm.
  absl::Status Tune(const Key& key, Plan& p, const Bf16* x, const Bf16* w, void* y,
                    CudaStream stream) {
    p.tuned = true;
    std::vector<cublasLtMatmulAlgo_t> candidates = std::move(p.candidates);
    p.candidates.clear();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(AsCuda(stream), &capture));
    if (capture != cudaStreamCaptureStatusNone || candidates.size() < 2) return absl::OkStatus();
    if (tuning == nullptr) return TimeCandidates(candidates, p, x, w, y, stream, nullptr);
    // Shared: take another context's pick, or make it for all.
    GemmTuningTable::Impl& t = tuning->impl();
    std::unique_lock<std::mutex> lock(t.mu);
    const auto inserted = t.entries.try_emplace({key, p.bias_in_epilogue});
    const auto it = inserted.first;
    if (!inserted.second) {
      t.cv.wait(lock, [&] { return it->second.done; });
      cublasLtMatmulHeuristicResult_t check{};
      if (it->second.found &&
          cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &it->second.algo, &check) ==
              CUBLAS_STATUS_SUCCESS) {
        p.algo = it->second.algo;
        return absl::OkStatus();
      }
      if (it->second.found) ++picks_refused;
      lock.unlock();
      return TimeCandidates(candidates, p, x, w, y, stream, nullptr);
    }
    lock.unlock();
    bool found = false;
    absl::Status status = TimeCandidates(candidates, p, x, w, y, stream, &found);
    lock.lock();
    it->second.done = true;
    it->second.found = found && status.ok();
    it->second.algo = p.algo;
    if (t.next_outcome == GemmTuningTable::TestOutcome::kNothingTimed) {
      it->second.found = false;
    } else if (t.next_outcome == GemmTuningTable::TestOutcome::kUnusablePick) {
      it->second.algo = Fp64Algo(handle);
    }
    t.next_outcome = GemmTuningTable::TestOutcome::kPick;
    t.cv.notify_all();
    return status;
  }

  // One flush of L2 before timed run `i` (flush != nullptr).
  absl::Status Flush(CudaStream stream) {
    return ReadThroughL2(flush, flush_bytes, flush_blocks, static_cast<int*>(workspace), stream);
  }

  // Times `candidates` (see Tune) and sets p.algo to the fastest; `found`
  // (optional): whether any could be timed.
  absl::Status TimeCandidates(const std::vector<cublasLtMatmulAlgo_t>& candidates, Plan& p,
                              const Bf16* x, const Bf16* w, void* y, CudaStream stream,
                              bool* found) {
    ++shapes_timed;
    cudaEvent_t start = nullptr, stop = nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    if (const cudaError_t err = cudaEventCreate(&stop); err != cudaSuccess) {
      cudaEventDestroy(start);
      return CudaError(err, "GEMM autotune");
    }
    // A decode step streams every weight from HBM once, but back-to-back
    // runs of one GEMM would find a weight that fits in L2 (a TP rank's
    // qkv or o_proj) already there, and pick for that. So each timed run
    // follows a flush of twice the L2 size (where that much memory can be
    // had for the tuning). In a step, L2 holds what the kernels before
    // read (mostly weights), clean lines, so the flush reads: a flush that
    // writes (measured, then removed) leaves dirty lines whose write-back then
    // competes with the timed GEMM, which slowed the decode shapes by
    // 13-31% on the H200 and changed the pick for some of them
    // (tests/bench/results/gemm_search_h200.json).
    if (!flush_tried) {
      flush_tried = true;
      int l2_bytes = 0, dev = 0, sms = 0;
      if (cudaGetDevice(&dev) == cudaSuccess &&
          cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, dev) == cudaSuccess &&
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
          l2_bytes > 0 && cudaMalloc(&flush, 2 * static_cast<size_t>(l2_bytes)) == cudaSuccess) {
        flush_bytes = 2 * static_cast<size_t>(l2_bytes) / 16 * 16;
        flush_blocks = std::max(1, sms) * 4;
        if (cudaMemset(flush, 0, flush_bytes) != cudaSuccess) {
          cudaFree(flush);
          flush = nullptr;
          flush_bytes = 0;
        }
      } else {
        flush = nullptr;
      }
      cudaGetLastError();  // a failed query or allocation only means no flush
    }
    const float alpha = 1.0f, beta = 0.0f;
    float best_ms = 0.f;
    bool have_best = false;
    absl::Status status;
    for (const cublasLtMatmulAlgo_t& algo : candidates) {
      auto run = [&] {
        return cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &algo,
                              workspace, kWorkspaceBytes, AsCuda(stream));
      };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;
      float total_ms = 0.f;
      cudaError_t err = cudaSuccess;
      absl::Status flushed;
      for (int i = 0; i < kAutotuneReps && err == cudaSuccess && flushed.ok(); ++i) {
        if (flush != nullptr) flushed = Flush(stream);
        if (!flushed.ok()) break;
        err = cudaEventRecord(start, AsCuda(stream));
        if (err == cudaSuccess && run() != CUBLAS_STATUS_SUCCESS) err = cudaErrorUnknown;
        if (err == cudaSuccess) err = cudaEventRecord(stop, AsCuda(stream));
        if (err == cudaSuccess) err = cudaEventSynchronize(stop);
        float ms = 0.f;
        if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
        total_ms += ms;
      }
      if (!flushed.ok() || err != cudaSuccess) {
        status.Update(flushed.ok() ? CudaError(err, "GEMM autotune") : flushed);
        break;
      }
      if (!have_best || total_ms < best_ms) {
        best_ms = total_ms;
        p.algo = algo;
        have_best = true;
      }
    }
    if (found != nullptr) *found = have_best;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return status;
  }

  absl::StatusOr<Plan*> GetPlan(const Key& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return &it->second;
    const bool has_bias = std::get<4>(key);
    Plan plan;
    const absl::Status fused = Build(key, has_bias, &plan);
    if (!fused.ok()) {
      Destroy(plan);
      if (!has_bias) return fused;
      // No fused fp32-bias epilogue for this shape: plain GEMM + bias kernel.
      const absl::Status plain = Build(key, false, &plan);
      if (!plain.ok()) {
        Destroy(plan);
        return plain;
      }
    }
    return &plans.emplace(key, plan).first->second;
  }

  absl::Status Run(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n, const float* bias,
                   void* y, bool f32_out, CudaStream stream) {
    if (m < 0 || n <= 0 || k <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("Gemm: bad shape m=", m, " n=", n, " k=", k));
    }
    if (m == 0) return absl::OkStatus();
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gemm: shape above int32 range m=", m, " n=", n, " k=", k));
    }
    if (x == nullptr || w == nullptr || y == nullptr) {
      return absl::InvalidArgumentError("Gemm: null pointer");
    }
    std::lock_guard<std::mutex> lock(mu);
    // Decode-sized GEMMs: the tensor-core GEMV beats cuBLASLt's m <= 8
    // kernels on the smaller weights (an early H200 run of cuda_ops_bench:
    // 6144x4096 75% vs 67% of HBM, 4096x4096 63% vs 59%)
    // and loses on the large ones (28672x4096 90% vs 95%, 4096x14336 82% vs
    // 85%). Rule: m <= 8, k % 8 == 0, x and W 16-byte aligned, and W at most
    // 2^25 elements (64 MiB of bf16).
    if (use_gemv && n * k <= gemv_max_weight_elems && GemvApplicable(x, m, k, w)) {
      return f32_out ? GemvBf16(x, m, k, w, n, bias, static_cast<float*>(y), gemv, stream)
                     : GemvBf16(x, m, k, w, n, bias, static_cast<Bf16*>(y), gemv, stream);
    }
    if (f32_out || bias == nullptr) return RunLocked(x, m, k, w, n, bias, y, f32_out, stream);
    // bf16 output with an fp32 bias: cuBLASLt's bias epilogue wants a bias of
    // the output type, so compute in fp32 (bias fused there) into the fixed
    // scratch, in row chunks that fit it, and round each chunk once.
    const int64_t scratch_elems = static_cast<int64_t>(kScratchBytes / sizeof(float));
    if (n > scratch_elems) {
      return absl::InvalidArgumentError(absl::StrCat("Gemm: biased bf16 GEMM with n=", n,
                                                     " exceeds the fp32 scratch (", scratch_elems,
                                                     " values per row)"));
    }
    const int64_t chunk = std::max<int64_t>(1, scratch_elems / n);
    for (int64_t i0 = 0; i0 < m; i0 += chunk) {
      const int64_t mc = std::min(chunk, m - i0);
      bool fused = false;
      if (absl::Status s =
              RunLocked(x + i0 * k, mc, k, w, n, bias, scratch, /*f32_out=*/true, stream, &fused);
          !s.ok()) {
        return s;
      }
      const int threads = 256;
      RoundToBf16Kernel<<<ElementwiseBlocks(mc * n, threads), threads, 0, AsCuda(stream)>>>(
          static_cast<const float*>(scratch), mc, n, fused ? nullptr : bias,
          static_cast<uint16_t*>(y) + i0 * n);
      if (absl::Status s = CheckLastLaunch("Gemm bf16 rounding"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // `*bias_fused` (optional) tells whether the bias was added; when it is
  // null, a bias the epilogue cannot take is added by a kernel (fp32 output
  // only; the bf16+bias path passes bias_fused and adds it while rounding).
  absl::Status RunLocked(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                         const float* bias, void* y, bool f32_out, CudaStream stream,
                         bool* bias_fused = nullptr) {
    // Leading dimensions count towards the alignment of every row.
    const int al_x = std::min(AlignmentOf(x), AlignmentOf(reinterpret_cast<const void*>(k * 2)));
    const int al_w = std::min(AlignmentOf(w), AlignmentOf(reinterpret_cast<const void*>(k * 2)));
    const int elem = f32_out ? 4 : 2;
    const int al_y = std::min(AlignmentOf(y), AlignmentOf(reinterpret_cast<const void*>(n * elem)));
    const int al_b = bias != nullptr ? AlignmentOf(bias) : 16;
    const Key key{m, n, k, f32_out, bias != nullptr, al_x, al_w, al_y, al_b};
    absl::StatusOr<Plan*> plan = GetPlan(key);
    if (!plan.ok()) return plan.status();
    Plan& p = **plan;
    if (p.bias_in_epilogue) {
      TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (!p.tuned && m <= autotune_max_m) {
      if (absl::Status s = Tune(key, p, x, w, y, stream); !s.ok()) return s;
    }
    const float alpha = 1.0f, beta = 0.0f;
    TESSERA_LT_RETURN_IF_ERROR(cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d,
                                              y, p.d, &p.algo, workspace, kWorkspaceBytes,
                                              AsCuda(stream)));
    if (bias_fused != nullptr) {
      *bias_fused = p.bias_in_epilogue;
      return absl::OkStatus();
    }
    if (bias != nullptr && !p.bias_in_epilogue) {
      const int threads = 256;
      AddBiasF32Kernel<<<ElementwiseBlocks(m * n, threads), threads, 0, AsCuda(stream)>>>(
          static_cast<float*>(y), m, n, bias);
      return CheckLastLaunch("Gemm bias");
    }
    return absl::OkStatus();
  }
};

GemmContext::GemmContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmContext::~GemmContext() = default;

absl::StatusOr<std::unique_ptr<GemmContext>> GemmContext::Create() {
  auto impl = std::make_unique<Impl>();
  TESSERA_LT_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->workspace, kWorkspaceBytes));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->scratch, kScratchBytes));
  int device = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&impl->gemv.num_sms, cudaDevAttrMultiProcessorCount, device));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&impl->gemv.partials, kGemvPartialFloats * sizeof(float)));
  impl->gemv.partial_capacity = kGemvPartialFloats;
  if (absl::Status st = GemvResidentCtasPerSm(&impl->gemv.ctas_per_sm); !st.ok()) return st;
  impl->staged_supported = GemvStagedSupported();
  impl->gemv.staged = impl->staged_supported;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMalloc(&impl->gemv.counters, kGemvCounters * sizeof(uint32_t)));
  impl->gemv.counter_capacity = kGemvCounters;
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemset(impl->gemv.counters, 0, kGemvCounters * sizeof(uint32_t)));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return std::unique_ptr<GemmContext>(new GemmContext(std::move(impl)));
}

void GemmContext::SetAutotune(int64_t max_m) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->autotune_max_m = max_m;
  if (max_m <= 0) impl_->FreeFlush();  // the window closed
}

void GemmContext::SetAutotuneCandidates(int candidates) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->autotune_candidates = std::clamp(candidates, 1, kGemmMaxAutotuneCandidates);
}

void GemmContext::ShareTuning(std::shared_ptr<GemmTuningTable> table) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->tuning = std::move(table);
}

int GemmContext::shapes_timed() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->shapes_timed;
}

int GemmContext::picks_refused() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->picks_refused;
}

void GemmContext::SetUseGemv(bool use) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->use_gemv = use;
}

void GemmContext::SetGemvMaxWeightElems(int64_t elems) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->gemv_max_weight_elems = elems;
}

bool GemmContext::GemvTakes(int64_t m, int64_t k) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->use_gemv && m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0;
}

absl::Status GemmContext::QkvRope(const Bf16* x, int64_t m, int64_t k, const Bf16* w_qkv,
                                  const float* bias, Bf16* qkv, const GemvQkvRope& rope,
                                  CudaStream stream) {
  if (!GemvTakes(m, k)) {
    return absl::FailedPreconditionError(
        absl::StrCat("QkvRope: the GEMV path is off or does not take m=", m, " k=", k));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  GemvWorkspace ws = impl_->gemv;
  ws.staged = impl_->StagedTakesLocked(m, rope.q_rows + 2 * rope.k_rows, k);
  return GemvQkvRopeBf16(x, m, k, w_qkv, bias, qkv, rope, ws, stream);
}

absl::Status GemmContext::Gemm(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                               const float* bias, Bf16* y, CudaStream stream) {
  return impl_->Run(x, m, k, w, n, bias, y, /*f32_out=*/false, stream);
}

void GemmContext::SetUseStagedGemv(bool use) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->gemv.staged = use && impl_->staged_supported;
}

bool GemmContext::StagedTakes(int64_t m, int64_t n, int64_t k) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->StagedTakesLocked(m, n, k);
}

absl::Status GemmContext::GemmChained(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                                      const float* bias, Bf16* y, CudaStream stream) {
  if (StagedTakes(m, n, k) && GemvStagedApplicable(x, m, n, k, w) && y != nullptr) {
    return GemvStagedBf16(x, m, k, w, n, bias, y, stream);
  }
  return Gemm(x, m, k, w, n, bias, y, stream);
}

absl::Status GemmContext::Gemm(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                               const float* bias, float* y, CudaStream stream) {
  return impl_->Run(x, m, k, w, n, bias, y, /*f32_out=*/true, stream);
}

}  // namespace tessera::kernels::cuda
