#include "kernels/cpu_backend.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "kernels/cpu/fp8_linear.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/reference_ops.h"

namespace tessera::kernels {
namespace {

std::string S(std::string_view v) { return std::string(v); }

std::optional<std::string> NeedsCpuDevice(const DeviceDescription& device) {
  if (device.kind == DeviceKind::kCpu) return std::nullopt;
  return absl::StrCat("runs on the host CPU with host memory; the device is ",
                      S(DeviceKindName(device.kind)), ":", device.ordinal);
}

// Reference entries with the optimized signatures (the context is unused).
namespace ref {
absl::Status Embedding(const cpu::CpuContext&, const cpu::WeightMatrix& t,
                       absl::Span<const int32_t> ids, float* out) {
  return cpu::reference::Embedding(t, ids, out);
}
void RmsNorm(const cpu::CpuContext&, const float* x, const float* w, int64_t rows, int64_t dim,
             float eps, float* out) {
  cpu::reference::RmsNorm(x, w, rows, dim, eps, out);
}
void FusedAddRmsNorm(const cpu::CpuContext&, float* x, float* r, const float* w, int64_t rows,
                     int64_t dim, float eps) {
  cpu::reference::FusedAddRmsNorm(x, r, w, rows, dim, eps);
}
void Rope(const cpu::CpuContext&, absl::Span<const int32_t> pos, absl::Span<const float> inv_freq,
          int head_dim, float* q, int heads, int64_t q_stride, float* k, int kv_heads,
          int64_t k_stride) {
  cpu::reference::Rope(pos, inv_freq, head_dim, q, heads, q_stride, k, kv_heads, k_stride);
}
void Gemm(const cpu::CpuContext&, const float* x, int64_t m, const cpu::WeightMatrix& w,
          const float* bias, float* y) {
  cpu::reference::Gemm(x, m, w, bias, y);
}
void SiluMul(const cpu::CpuContext&, const float* gate_up, int64_t rows, int64_t inter,
             float* out) {
  cpu::reference::SiluMul(gate_up, rows, inter, out);
}
absl::Status WriteKvCache(const cpu::CpuContext&, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, absl::Span<const int64_t> slots,
                          const cpu::PagedKvCache& cache) {
  return cpu::reference::WriteKvCache(k, k_stride, v, v_stride, slots, cache);
}
absl::Status PagedAttention(const cpu::CpuContext&, const cpu::PagedAttentionArgs& args) {
  return cpu::reference::PagedAttention(args);
}
void Softmax(const cpu::CpuContext&, const float* x, int64_t rows, int64_t cols, float* out) {
  cpu::reference::Softmax(x, rows, cols, out);
}
void LogSoftmax(const cpu::CpuContext&, const float* x, int64_t rows, int64_t cols, float* out) {
  cpu::reference::LogSoftmax(x, rows, cols, out);
}
void Argmax(const cpu::CpuContext&, const float* x, int64_t rows, int64_t cols, int32_t* out) {
  cpu::reference::Argmax(x, rows, cols, out);
}
void ReduceSum(const cpu::CpuContext&, absl::Span<const float* const> inputs, int64_t n,
               float* out) {
  cpu::reference::ReduceSum(inputs, n, out);
}
void MoeRoute(const cpu::CpuContext&, const float* logits, int64_t tokens,
              const cpu::MoeRoutingParams& params, int32_t* experts, float* weights) {
  cpu::reference::MoeRoute(logits, tokens, params, experts, weights);
}
void MoeExperts(const cpu::CpuContext&, const cpu::MoeExpertsArgs& args) {
  cpu::reference::MoeExperts(args);
}
void Fp8Gemm(const cpu::CpuContext&, const float* x, int64_t m, const cpu::Fp8WeightMatrix& w,
             const cpu::Fp8Activation& a, const float* bias, float* y, int64_t ldy) {
  cpu::reference::Fp8Gemm(x, m, w, a, bias, y, ldy);
}
}  // namespace ref

CpuKernels MakeTable(bool optimized) {
  CpuKernels k;
  if (optimized) {
    k.embedding = &cpu::Embedding;
    k.rms_norm = &cpu::RmsNorm;
    k.fused_add_rms_norm = &cpu::FusedAddRmsNorm;
    k.rope = &cpu::Rope;
    k.gemm = &cpu::Gemm;
    k.silu_mul = &cpu::SiluMul;
    k.write_kv_cache = &cpu::WriteKvCache;
    k.attention_prefill = &cpu::PagedAttention;
    k.attention_decode = &cpu::PagedAttention;
    k.softmax = &cpu::Softmax;
    k.log_softmax = &cpu::LogSoftmax;
    k.argmax = &cpu::Argmax;
    k.reduce_sum = &cpu::ReduceSum;
    k.moe_route = &cpu::MoeRoute;
    k.moe_experts = &cpu::MoeExperts;
    k.fp8_gemm = &cpu::Fp8Gemm;
  } else {
    k.embedding = &ref::Embedding;
    k.rms_norm = &ref::RmsNorm;
    k.fused_add_rms_norm = &ref::FusedAddRmsNorm;
    k.rope = &ref::Rope;
    k.gemm = &ref::Gemm;
    k.silu_mul = &ref::SiluMul;
    k.write_kv_cache = &ref::WriteKvCache;
    k.attention_prefill = &ref::PagedAttention;
    k.attention_decode = &ref::PagedAttention;
    k.softmax = &ref::Softmax;
    k.log_softmax = &ref::LogSoftmax;
    k.argmax = &ref::Argmax;
    k.reduce_sum = &ref::ReduceSum;
    k.moe_route = &ref::MoeRoute;
    k.moe_experts = &ref::MoeExperts;
    k.fp8_gemm = &ref::Fp8Gemm;
  }
  for (Op op : kAllOps) {
    k.backend[static_cast<size_t>(op)] = S(optimized ? kCpuBackend : kCpuReferenceBackend);
  }
  return k;
}

// Copies the entries serving `op` from `from` into `to`.
void CopyOp(Op op, const CpuKernels& from, CpuKernels* to) {
  switch (op) {
    case Op::kEmbedding:
      to->embedding = from.embedding;
      break;
    case Op::kRmsNorm:
      to->rms_norm = from.rms_norm;
      to->fused_add_rms_norm = from.fused_add_rms_norm;
      break;
    case Op::kRope:
      to->rope = from.rope;
      break;
    case Op::kGemm:
      to->gemm = from.gemm;
      break;
    case Op::kSiluMul:
      to->silu_mul = from.silu_mul;
      break;
    case Op::kKvCacheWrite:
      to->write_kv_cache = from.write_kv_cache;
      break;
    case Op::kAttentionPrefill:
      to->attention_prefill = from.attention_prefill;
      break;
    case Op::kAttentionDecode:
      to->attention_decode = from.attention_decode;
      break;
    case Op::kLogitsProcessing:
      to->softmax = from.softmax;
      to->log_softmax = from.log_softmax;
      break;
    case Op::kSampling:
      to->argmax = from.argmax;
      break;
    case Op::kAllReduce:
      to->reduce_sum = from.reduce_sum;
      break;
    case Op::kMoeRouting:
      to->moe_route = from.moe_route;
      break;
    case Op::kMoeExperts:
      to->moe_experts = from.moe_experts;
      break;
    case Op::kFp8Gemm:
      to->fp8_gemm = from.fp8_gemm;
      break;
  }
  to->backend[static_cast<size_t>(op)] = from.BackendOf(op);
}

// ---------------------------------------------------------------------------
// Preflight.

class Preflight {
 public:
  Preflight(const CpuKernels& kernels, const cpu::CpuContext& ctx) : k_(kernels), ctx_(ctx) {}

  absl::Status Run() {
    RunEmbedding();
    RunNorms();
    RunRope();
    RunGemm();
    RunSiluMul();
    RunAttention();
    RunLogits();
    RunReduceSum();
    RunMoeRouting();
    RunMoeExperts();
    RunFp8Gemm();
    return status_;
  }

 private:
  std::vector<float> Random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }

  // Records the first mismatch |got - want| > tol(i) for `op`.
  void Compare(Op op, std::string_view what, const std::vector<float>& got,
               const std::vector<float>& want, const std::function<float(size_t)>& tol) {
    if (!status_.ok()) return;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool both_inf = std::isinf(want[i]) && got[i] == want[i];
      if (both_inf || std::fabs(got[i] - want[i]) <= tol(i)) continue;
      status_ = absl::InternalError(absl::StrCat(
          "preflight: ", S(OpName(op)), " (", S(what), ") on backend ", k_.BackendOf(op),
          " isa=", S(cpu::CpuIsaName(ctx_.isa)), " differs from cpu_reference at [", i, "]: got ",
          got[i], ", want ", want[i], ", tolerance ", tol(i)));
      return;
    }
  }

  void Check(Op op, const absl::Status& s) {
    if (status_.ok() && !s.ok()) {
      status_ = absl::InternalError(absl::StrCat("preflight: ", S(OpName(op)), " on backend ",
                                                 k_.BackendOf(op), " failed: ", s.ToString()));
    }
  }

  static std::function<float(size_t)> Rel(const std::vector<float>& want, float rel, float abs) {
    return [&want, rel, abs](size_t i) { return rel * std::fabs(want[i]) + abs; };
  }

  void RunEmbedding() {
    std::vector<cpu::bf16_t> table;
    for (float v : Random(5 * 19)) table.push_back(cpu::F32ToBf16(v));
    const cpu::WeightMatrix w{table.data(), cpu::DType::kBF16, 5, 19};
    const std::vector<int32_t> ids = {4, 0, 2};
    std::vector<float> got(3 * 19), want(3 * 19);
    Check(Op::kEmbedding, k_.embedding(ctx_, w, ids, got.data()));
    Check(Op::kEmbedding, cpu::reference::Embedding(w, ids, want.data()));
    Compare(Op::kEmbedding, "embedding", got, want, [](size_t) { return 0.0f; });
  }

  void RunNorms() {
    const int64_t rows = 3, dim = 37;
    std::vector<float> x = Random(rows * dim, -3, 3), w = Random(dim, 0.5f, 1.5f);
    std::vector<float> got(x.size()), want(x.size());
    k_.rms_norm(ctx_, x.data(), w.data(), rows, dim, 1e-6f, got.data());
    cpu::reference::RmsNorm(x.data(), w.data(), rows, dim, 1e-6f, want.data());
    Compare(Op::kRmsNorm, "rms_norm", got, want, Rel(want, 1e-5f, 1e-6f));
    std::vector<float> r = Random(rows * dim);
    std::vector<float> got_x = x, got_r = r, want_x = x, want_r = r;
    k_.fused_add_rms_norm(ctx_, got_x.data(), got_r.data(), w.data(), rows, dim, 1e-6f);
    cpu::reference::FusedAddRmsNorm(want_x.data(), want_r.data(), w.data(), rows, dim, 1e-6f);
    Compare(Op::kRmsNorm, "fused_add_rms_norm x", got_x, want_x, Rel(want_x, 1e-5f, 1e-6f));
    Compare(Op::kRmsNorm, "fused_add_rms_norm residual", got_r, want_r,
            [](size_t) { return 0.0f; });
  }

  void RunRope() {
    const int d = 20, heads = 2, kv_heads = 1, tokens = 3;
    const int64_t stride = int64_t{heads + kv_heads} * d;
    std::vector<float> qk = Random(tokens * stride);
    std::vector<float> inv_freq(d / 2);
    for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / d);
    const std::vector<int32_t> positions = {0, 7, 4095};
    std::vector<float> got = qk, want = qk;
    k_.rope(ctx_, positions, inv_freq, d, got.data(), heads, stride, got.data() + heads * d,
            kv_heads, stride);
    cpu::reference::Rope(positions, inv_freq, d, want.data(), heads, stride,
                         want.data() + heads * d, kv_heads, stride);
    Compare(Op::kRope, "rope", got, want, [](size_t) { return 1.1e-5f; });
  }

  void RunGemm() {
    const int64_t n = 13, k = 37;
    std::vector<cpu::bf16_t> w16;
    for (float v : Random(n * k)) w16.push_back(cpu::F32ToBf16(v));
    const cpu::WeightMatrix w{w16.data(), cpu::DType::kBF16, n, k};
    const std::vector<float> bias = Random(n);
    for (int64_t m : {1, 5}) {
      const std::vector<float> x = Random(m * k);
      std::vector<float> got(m * n), want(m * n);
      k_.gemm(ctx_, x.data(), m, w, bias.data(), got.data());
      cpu::reference::Gemm(x.data(), m, w, bias.data(), want.data());
      // |x|, |w| <= 1: sum_k |x w| <= k.
      Compare(Op::kGemm, absl::StrCat("gemm m=", m), got, want,
              [k](size_t) { return 1e-5f * k + 1e-6f; });
    }
  }

  void RunSiluMul() {
    const int64_t rows = 2, inter = 45;
    const std::vector<float> gate_up = Random(rows * 2 * inter, -20, 20);
    std::vector<float> got(rows * inter), want(rows * inter);
    k_.silu_mul(ctx_, gate_up.data(), rows, inter, got.data());
    cpu::reference::SiluMul(gate_up.data(), rows, inter, want.data());
    Compare(Op::kSiluMul, "silu_mul", got, want, Rel(want, 1e-5f, 1e-6f));
  }

  void RunAttention() {
    const int heads = 4, kv_heads = 2, d = 18, bs = 4;
    const int64_t blocks = 6;
    const int64_t slot_stride = int64_t{kv_heads} * d;
    // Sequence 0: a 5-token prompt; sequence 1: one decode token after 6 cached.
    const std::vector<int32_t> query_start_loc = {0, 5, 6};
    const std::vector<int32_t> seq_lens = {5, 7};
    const std::vector<int32_t> block_tables = {3, 0, -1, 5, 1, -1};
    std::vector<float> got_k(blocks * bs * slot_stride, 0.0f), got_v = got_k;
    std::vector<float> want_k = got_k, want_v = got_k;
    cpu::PagedKvCache got_cache{got_k.data(), got_v.data(), blocks, bs, kv_heads, d};
    cpu::PagedKvCache want_cache{want_k.data(), want_v.data(), blocks, bs, kv_heads, d};
    // Write all 12 tokens' K/V (sequence 1's 7 positions, then sequence 0's 5).
    std::vector<int64_t> slots;
    for (int p = 0; p < 7; ++p) slots.push_back(int64_t{block_tables[3 + p / bs]} * bs + p % bs);
    for (int p = 0; p < 5; ++p) slots.push_back(int64_t{block_tables[p / bs]} * bs + p % bs);
    slots.push_back(-1);  // padding
    const std::vector<float> k = Random(slots.size() * slot_stride);
    const std::vector<float> v = Random(slots.size() * slot_stride);
    Check(Op::kKvCacheWrite,
          k_.write_kv_cache(ctx_, k.data(), slot_stride, v.data(), slot_stride, slots, got_cache));
    Check(Op::kKvCacheWrite, cpu::reference::WriteKvCache(k.data(), slot_stride, v.data(),
                                                          slot_stride, slots, want_cache));
    Compare(Op::kKvCacheWrite, "k", got_k, want_k, [](size_t) { return 0.0f; });
    Compare(Op::kKvCacheWrite, "v", got_v, want_v, [](size_t) { return 0.0f; });

    const std::vector<float> q = Random(6 * heads * d);
    cpu::PagedAttentionArgs args;
    args.q = q.data();
    args.q_token_stride = int64_t{heads} * d;
    args.num_heads = heads;
    args.cache = want_cache;
    args.query_start_loc = query_start_loc;
    args.seq_lens = seq_lens;
    args.block_tables = block_tables;
    args.block_table_stride = 3;
    args.scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> want(6 * heads * d), got(want.size());
    args.out = want.data();
    Check(Op::kAttentionPrefill, cpu::reference::PagedAttention(args));
    args.out = got.data();
    Check(Op::kAttentionPrefill, k_.attention_prefill(ctx_, args));
    Compare(Op::kAttentionPrefill, "mixed batch", got, want, [](size_t) { return 2e-5f; });

    // Decode: only sequence 1's token.
    const std::vector<int32_t> decode_start = {0, 1};
    const std::vector<int32_t> decode_lens = {7};
    const std::vector<int32_t> decode_table = {5, 1, -1};
    args.q = q.data() + 5 * heads * d;
    args.query_start_loc = decode_start;
    args.seq_lens = decode_lens;
    args.block_tables = decode_table;
    std::vector<float> got_decode(heads * d);
    args.out = got_decode.data();
    Check(Op::kAttentionDecode, k_.attention_decode(ctx_, args));
    Compare(Op::kAttentionDecode, "decode", got_decode,
            std::vector<float>(want.begin() + 5 * heads * d, want.end()),
            [](size_t) { return 2e-5f; });
  }

  void RunLogits() {
    const int64_t rows = 2, cols = 50;
    std::vector<float> x = Random(rows * cols, -30, 30);
    x[3] = -std::numeric_limits<float>::infinity();
    x[cols + 7] = x[cols + 40] = 99.0f;  // a tie: the first wins
    std::vector<float> got(x.size()), want(x.size());
    k_.softmax(ctx_, x.data(), rows, cols, got.data());
    cpu::reference::Softmax(x.data(), rows, cols, want.data());
    Compare(Op::kLogitsProcessing, "softmax", got, want, Rel(want, 1e-5f, 1e-7f));
    k_.log_softmax(ctx_, x.data(), rows, cols, got.data());
    cpu::reference::LogSoftmax(x.data(), rows, cols, want.data());
    Compare(Op::kLogitsProcessing, "log_softmax", got, want, Rel(want, 1e-5f, 1e-5f));
    std::vector<int32_t> got_ids(rows), want_ids(rows);
    k_.argmax(ctx_, x.data(), rows, cols, got_ids.data());
    cpu::reference::Argmax(x.data(), rows, cols, want_ids.data());
    Compare(Op::kSampling, "argmax",
            {static_cast<float>(got_ids[0]), static_cast<float>(got_ids[1])},
            {static_cast<float>(want_ids[0]), static_cast<float>(want_ids[1])},
            [](size_t) { return 0.0f; });
  }

  void RunReduceSum() {
    const int64_t n = 37;
    const std::vector<float> a = Random(n), b = Random(n), c = Random(n);
    const std::vector<const float*> inputs = {a.data(), b.data(), c.data()};
    std::vector<float> got(n), want(n);
    k_.reduce_sum(ctx_, inputs, n, got.data());
    cpu::reference::ReduceSum(inputs, n, want.data());
    Compare(Op::kAllReduce, "reduce_sum", got, want, [](size_t) { return 0.0f; });
  }

  // Both scorings on odd sizes, with a tie (experts 1 and 6) that the
  // lower index must win; the ids must match exactly.
  void RunMoeRouting() {
    const int tokens = 3, experts = 8;
    std::vector<float> logits = Random(tokens * experts, -4, 4);
    logits[1] = logits[6] = 5.0f;
    const std::vector<float> bias = Random(experts, -0.1f, 0.1f);
    cpu::MoeRoutingParams softmax{cpu::MoeScoringFunction::kSoftmax, experts, 3, true};
    cpu::MoeRoutingParams grouped{
        cpu::MoeScoringFunction::kSigmoidGrouped, experts, 3, true, 4, 2, 2.5f, bias.data()};
    for (const cpu::MoeRoutingParams& p : {softmax, grouped}) {
      std::vector<int32_t> got_ids(tokens * p.top_k), want_ids(got_ids.size());
      std::vector<float> got(got_ids.size()), want(got_ids.size());
      k_.moe_route(ctx_, logits.data(), tokens, p, got_ids.data(), got.data());
      cpu::reference::MoeRoute(logits.data(), tokens, p, want_ids.data(), want.data());
      Compare(Op::kMoeRouting, "experts", std::vector<float>(got_ids.begin(), got_ids.end()),
              std::vector<float>(want_ids.begin(), want_ids.end()), [](size_t) { return 0.0f; });
      Compare(Op::kMoeRouting, "weights", got, want, Rel(want, 1e-6f, 1e-7f));
    }
  }

  // Three experts of width 5 over hidden 13 (bf16), four tokens, top-2,
  // with expert 2 chosen by nobody and one choice held elsewhere (id 7).
  void RunMoeExperts() {
    const int64_t hidden = 13, inter = 5, tokens = 4;
    std::vector<std::vector<cpu::bf16_t>> storage;  // moving the outer vector keeps the data
    auto matrix = [&](int64_t rows, int64_t cols) {
      storage.emplace_back();
      for (float v : Random(rows * cols)) storage.back().push_back(cpu::F32ToBf16(v));
      return cpu::WeightMatrix{storage.back().data(), cpu::DType::kBF16, rows, cols};
    };
    std::vector<cpu::WeightMatrix> gate_up, down;
    for (int e = 0; e < 3; ++e) {
      gate_up.push_back(matrix(2 * inter, hidden));
      down.push_back(matrix(hidden, inter));
    }
    const std::vector<float> x = Random(tokens * hidden);
    const std::vector<int32_t> ids = {11, 10, 10, 7, 11, 10, 10, 11};
    const std::vector<float> weights = {0.75f, 0.25f, 1.0f, 0.5f, 0.4f, 0.6f, 0.9f, 0.1f};
    cpu::MoeExpertsArgs args;
    args.x = x.data();
    args.num_tokens = tokens;
    args.hidden = hidden;
    args.gate_up = gate_up;
    args.down = down;
    args.first_expert = 10;
    args.ids = ids.data();
    args.weights = weights.data();
    args.top_k = 2;
    std::vector<float> got(tokens * hidden), want(got.size());
    args.out = got.data();
    Check(Op::kMoeExperts, cpu::ValidateMoeExperts(args));
    k_.moe_experts(ctx_, args);
    args.out = want.data();
    cpu::reference::MoeExperts(args);
    // Each output sums two expert outputs of magnitude <= inter * hidden.
    Compare(Op::kMoeExperts, "moe_experts", got, want,
            [](size_t) { return 1e-5f * hidden * inter; });
  }

  // Two tokens through a 130 x 300 FP8 weight with 128-blocks (partial last
  // blocks), per-token groups of 128.
  void RunFp8Gemm() {
    const int64_t m = 2, rows = 130, cols = 300;
    std::vector<uint8_t> w;
    for (float v : Random(rows * cols, -400, 400)) w.push_back(cpu::FloatToE4m3(v));
    std::vector<float> scales = Random(rows * 3, 1e-3f, 2e-3f);
    const cpu::Fp8WeightMatrix matrix{w.data(), rows, cols, scales.data(), 128};
    const cpu::Fp8Activation act{cpu::Fp8ActivationMode::kDynamicGroup, 128, 1.f};
    std::vector<float> x = Random(m * cols, -2, 2), bias = Random(rows);
    std::vector<float> got(m * rows), want(m * rows);
    Check(Op::kFp8Gemm, cpu::ValidateFp8Gemm(matrix, act));
    k_.fp8_gemm(ctx_, x.data(), m, matrix, act, bias.data(), got.data(), rows);
    cpu::reference::Fp8Gemm(x.data(), m, matrix, act, bias.data(), want.data(), rows);
    Compare(Op::kFp8Gemm, "fp8_gemm", got, want, Rel(want, 1e-5f, 1e-5f));
  }

  const CpuKernels& k_;
  const cpu::CpuContext& ctx_;
  std::mt19937 rng_{20240601};
  absl::Status status_;
};

}  // namespace

std::string CpuBackendDetails(const DeviceDescription& device) {
  const cpu::CpuIsa best = cpu::BestCpuIsa(device.cpu);
  std::string out = absl::StrCat(S(cpu::CpuIsaName(best)), " kernels");
  if (best != cpu::CpuIsa::kAvx512) {
    const cpu::CpuIsa next =
        best == cpu::CpuIsa::kScalar ? cpu::CpuIsa::kAvx2 : cpu::CpuIsa::kAvx512;
    if (std::optional<std::string> why = cpu::WhyNotCpuIsa(next, device.cpu)) {
      absl::StrAppend(&out, " (", *why, ")");
    }
  }
  return out;
}

void AddCpuCandidates(Registry* registry) {
  for (Op op : kAllOps) {
    absl::Status s =
        registry->Add(Candidate{S(kCpuBackend), op, &NeedsCpuDevice,
                                [](const DeviceDescription& d) { return CpuBackendDetails(d); }});
    s.Update(registry->Add(
        Candidate{S(kCpuReferenceBackend), op, &NeedsCpuDevice, [](const DeviceDescription&) {
                    return std::string("plain reference loops, one thread");
                  }}));
    (void)s;  // Names are constant and unique; Add cannot fail here.
  }
}

const CpuKernels& OptimizedCpuKernels() {
  static const CpuKernels* table = new CpuKernels(MakeTable(true));
  return *table;
}

const CpuKernels& ReferenceCpuKernels() {
  static const CpuKernels* table = new CpuKernels(MakeTable(false));
  return *table;
}

absl::StatusOr<CpuKernels> CpuKernelsFor(const SelectionReport& report) {
  CpuKernels out = OptimizedCpuKernels();
  for (Op op : kAllOps) {
    const Selection* s = report.Find(op);
    if (s == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the selection report has no entry for ", S(OpName(op))));
    }
    if (s->chosen == kCpuBackend) {
      CopyOp(op, OptimizedCpuKernels(), &out);
    } else if (s->chosen == kCpuReferenceBackend) {
      CopyOp(op, ReferenceCpuKernels(), &out);
    } else {
      return absl::FailedPreconditionError(absl::StrCat(S(OpName(op)), " was given to backend ",
                                                        s->chosen, ", which is not a CPU backend"));
    }
  }
  return out;
}

cpu::CpuContext CpuContextFor(const DeviceDescription& device, cpu::ThreadPool* pool) {
  return cpu::CpuContext{pool, cpu::BestCpuIsa(device.cpu)};
}

absl::Status PreflightCpuKernels(const CpuKernels& kernels, const cpu::CpuContext& ctx) {
  return Preflight(kernels, ctx).Run();
}

}  // namespace tessera::kernels
