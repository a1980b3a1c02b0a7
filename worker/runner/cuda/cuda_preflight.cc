#include "worker/runner/cuda/cuda_preflight.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/silu_mul.h"
#include "kernels/cuda_backend.h"
#include "worker/sampling/sampler.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
namespace ref = ::tessera::kernels::cpu::reference;
using kcu::Bf16;
using kcu::DeviceBuffer;

// Inputs are bf16-exact so the fp32 reference sees what the GPU sees.
std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = kcu::Bf16ToFloat(kcu::FloatToBf16(dist(rng)));
  return v;
}

std::vector<Bf16> AsBf16(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kcu::FloatToBf16(v[i]);
  return out;
}

// Device scratch for one check.
class Scratch {
 public:
  template <class T>
  absl::StatusOr<T*> Upload(const std::vector<T>& host) {
    absl::StatusOr<T*> p = Zeros<T>(host.size());
    if (!p.ok()) return p;
    if (auto s = kcu::CopyToDevice(*p, host.data(), host.size() * sizeof(T)); !s.ok()) return s;
    return p;
  }
  template <class T>
  absl::StatusOr<T*> Zeros(size_t n) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(std::max<size_t>(n, 1) * sizeof(T));
    if (!b.ok()) return b.status();
    if (auto s = kcu::MemsetDevice(b->data(), 0, b->size()); !s.ok()) return s;
    buffers_.push_back(std::move(*b));
    return buffers_.back().as<T>();
  }

 private:
  std::vector<DeviceBuffer> buffers_;
};

template <class T>
absl::StatusOr<std::vector<T>> Download(const T* device, size_t n) {
  std::vector<T> host(n);
  if (auto s = kcu::SynchronizeDevice(); !s.ok()) return s;
  if (auto s = kcu::CopyToHost(host.data(), device, n * sizeof(T)); !s.ok()) return s;
  if (auto s = kcu::SynchronizeDevice(); !s.ok()) return s;
  return host;
}

std::vector<float> FromBf16(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kcu::Bf16ToFloat(v[i]);
  return out;
}

// max |got - want| <= rel * max|want| + abs; the message names the worst index.
absl::Status Compare(std::string_view what, const std::vector<float>& got,
                     const std::vector<float>& want, float rel, float abs) {
  if (got.size() != want.size())
    return absl::InternalError(absl::StrCat(std::string(what), ": size mismatch"));
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  const float tol = rel * scale + abs;
  for (size_t i = 0; i < got.size(); ++i) {
    const float err = std::fabs(got[i] - want[i]);
    if (!(err <= tol)) {  // also catches NaN
      return absl::InternalError(absl::StrCat(std::string(what), ": element ", i, " is ", got[i],
                                              ", the CPU reference gives ", want[i], " (tolerance ",
                                              tol, ")"));
    }
  }
  return absl::OkStatus();
}

#define CHECK_OK(expr)                                 \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
#define ASSIGN(var, expr)                       \
  auto var##_or = (expr);                       \
  if (!var##_or.ok()) return var##_or.status(); \
  auto var = std::move(*var##_or)

constexpr float kBf16Rel = 1.0f / 128;  // output rounded to bf16 (8 bits of mantissa)

absl::Status CheckGemm() {
  Scratch d;
  const int64_t m = 3, k = 40, n = 24;
  std::vector<float> x = Random(m * k, 1), w = Random(n * k, 2), bias = Random(n, 3);
  ASSIGN(dx, d.Upload(AsBf16(x)));
  ASSIGN(dw, d.Upload(AsBf16(w)));
  ASSIGN(db, d.Upload(bias));
  ASSIGN(dy, d.Zeros<float>(m * n));
  ASSIGN(gemm, kcu::GemmContext::Create());
  CHECK_OK(gemm->Gemm(dx, m, k, dw, n, db, dy, nullptr));
  ASSIGN(got, Download(dy, m * n));
  std::vector<float> want(m * n);
  ref::Gemm(x.data(), m, kernels::cpu::WeightMatrix{w.data(), kernels::cpu::DType::kF32, n, k},
            bias.data(), want.data());
  return Compare("gemm", got, want, 1e-4f, 1e-4f);
}

absl::Status CheckNormsAndElementwise() {
  Scratch d;
  const int64_t rows = 3, cols = 40, vocab = 11, inter = 20;
  // Embedding.
  std::vector<float> table = Random(vocab * cols, 4);
  std::vector<int32_t> ids = {3, 0, 10};
  ASSIGN(dt, d.Upload(AsBf16(table)));
  ASSIGN(dids, d.Upload(ids));
  ASSIGN(demb, d.Zeros<float>(rows * cols));
  CHECK_OK(kcu::Embedding(dt, vocab, cols, dids, rows, demb, nullptr));
  ASSIGN(emb, Download(demb, rows * cols));
  std::vector<float> want_emb(rows * cols);
  CHECK_OK(
      ref::Embedding({table.data(), kernels::cpu::DType::kF32, vocab, cols}, ids, want_emb.data()));
  CHECK_OK(Compare("embedding", emb, want_emb, 0, 0));
  // RMSNorm and the fused add.
  std::vector<float> x = Random(rows * cols, 5, 3.0f), w = Random(cols, 6),
                     delta = Random(rows * cols, 7);
  ASSIGN(dx, d.Upload(x));
  ASSIGN(dw, d.Upload(w));
  ASSIGN(dout, d.Zeros<Bf16>(rows * cols));
  CHECK_OK(kcu::RmsNorm(dx, rows, cols, dw, 1e-6f, dout, nullptr));
  ASSIGN(norm, Download(dout, rows * cols));
  std::vector<float> want(rows * cols);
  ref::RmsNorm(x.data(), w.data(), rows, cols, 1e-6f, want.data());
  CHECK_OK(Compare("rmsnorm", FromBf16(norm), want, kBf16Rel, 1e-6f));
  ASSIGN(ddelta, d.Upload(AsBf16(delta)));
  CHECK_OK(kcu::FusedAddRmsNorm(ddelta, dx, rows, cols, dw, 1e-6f, dout, nullptr));
  ASSIGN(fused, Download(dout, rows * cols));
  ASSIGN(residual, Download(dx, rows * cols));
  std::vector<float> rx = delta, rres = x;
  ref::FusedAddRmsNorm(rx.data(), rres.data(), w.data(), rows, cols, 1e-6f);
  CHECK_OK(Compare("fused_add_rmsnorm", FromBf16(fused), rx, kBf16Rel, 1e-6f));
  CHECK_OK(Compare("fused_add_rmsnorm residual", residual, rres, 1e-6f, 1e-6f));
  // SiLU * mul.
  std::vector<float> gu = Random(rows * 2 * inter, 8, 4.0f);
  ASSIGN(dgu, d.Upload(AsBf16(gu)));
  ASSIGN(dact, d.Zeros<Bf16>(rows * inter));
  CHECK_OK(kcu::SiluMul(dgu, rows, inter, dact, nullptr));
  ASSIGN(act, Download(dact, rows * inter));
  std::vector<float> want_act(rows * inter);
  ref::SiluMul(gu.data(), rows, inter, want_act.data());
  return Compare("silu_mul", FromBf16(act), want_act, kBf16Rel, 1e-6f);
}

absl::Status CheckRope() {
  Scratch d;
  const int heads = 2, kv_heads = 1, dim = 16;
  const int64_t stride = (heads + 2 * kv_heads) * dim;  // q, k, v in one row
  std::vector<int32_t> positions = {0, 5, 17};
  const int64_t tokens = 3;
  std::vector<float> qkv = Random(tokens * stride, 9), qn = Random(dim, 10), kn = Random(dim, 11);
  std::vector<float> inv_freq(dim / 2);
  for (int i = 0; i < dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / dim);
  ASSIGN(dqkv, d.Upload(AsBf16(qkv)));
  ASSIGN(dpos, d.Upload(positions));
  ASSIGN(dfreq, d.Upload(inv_freq));
  ASSIGN(dqn, d.Upload(qn));
  ASSIGN(dkn, d.Upload(kn));
  CHECK_OK(kcu::Rope(dqkv, stride, heads, dqkv + heads * dim, stride, kv_heads, dim, dpos, tokens,
                     dfreq, dqn, dkn, 1e-6f, nullptr));
  ASSIGN(got, Download(dqkv, tokens * stride));
  // Reference: per-head RMSNorm (Qwen3) then rotation, in fp32.
  std::vector<float> want = qkv;
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = want.data() + t * stride;
    ref::RmsNorm(row, qn.data(), heads, dim, 1e-6f, row);
    ref::RmsNorm(row + heads * dim, kn.data(), kv_heads, dim, 1e-6f, row + heads * dim);
  }
  ref::Rope(positions, inv_freq, dim, want.data(), heads, stride, want.data() + heads * dim,
            kv_heads, stride);
  return Compare("rope", FromBf16(got), want, kBf16Rel, 1e-5f);
}

// The KV-cache write, prefill and decode attention; with sm90_prefill only
// the prefill, through the wgmma kernel (prefill_attention_sm90.h).
absl::Status CheckAttentionWith(bool sm90_prefill) {
  Scratch d;
  const int heads = 4, kv_heads = 2, dim = 64, block = 16, num_blocks = 6;
  const int64_t kv = int64_t{kv_heads} * dim, slots = int64_t{num_blocks} * block;
  // Two sequences: 5 new tokens (no context) and 3 new after 17 cached.
  const std::vector<int32_t> seq_lens = {5, 20}, qsl = {0, 5, 8};
  const std::vector<int32_t> tables = {4, 0, 0, 1, 5, 2};  // stride 3; seq 1 uses blocks 1, 5
  const int64_t stride = 3;
  // Every cached position of both sequences gets K/V through the kv-write kernel.
  std::vector<int64_t> slot_mapping;
  for (int s = 0; s < 2; ++s) {
    for (int p = 0; p < seq_lens[s]; ++p) {
      slot_mapping.push_back(int64_t{tables[s * stride + p / block]} * block + p % block);
    }
  }
  const int64_t written = static_cast<int64_t>(slot_mapping.size());
  std::vector<float> k = Random(written * kv, 12), v = Random(written * kv, 13);
  ASSIGN(dk, d.Upload(AsBf16(k)));
  ASSIGN(dv, d.Upload(AsBf16(v)));
  ASSIGN(dslots, d.Upload(slot_mapping));
  ASSIGN(kc, d.Zeros<Bf16>(slots * kv));
  ASSIGN(vc, d.Zeros<Bf16>(slots * kv));
  CHECK_OK(
      kcu::WriteKvCache(dk, kv, dv, kv, written, kv_heads, dim, dslots, kc, vc, slots, nullptr));
  ASSIGN(kc_host, Download(kc, slots * kv));
  std::vector<float> kref(slots * kv, 0.0f), vref(slots * kv, 0.0f);
  kernels::cpu::PagedKvCache cache{kref.data(), vref.data(), num_blocks, block, kv_heads, dim};
  CHECK_OK(ref::WriteKvCache(k.data(), kv, v.data(), kv, slot_mapping, cache));
  CHECK_OK(Compare("kv_cache_write", FromBf16(kc_host), kref, 0, 0));

  ASSIGN(dtables, d.Upload(tables));
  auto run = [&](bool decode, const std::vector<int32_t>& lens, const std::vector<int32_t>& starts,
                 std::string_view what) -> absl::Status {
    const int64_t tokens = starts.back();
    std::vector<float> q = Random(tokens * heads * dim, 14 + (decode ? 1 : 0));
    ASSIGN(dq, d.Upload(AsBf16(q)));
    ASSIGN(dlens, d.Upload(lens));
    ASSIGN(dstarts, d.Upload(starts));
    ASSIGN(dout, d.Zeros<Bf16>(tokens * heads * dim));
    const int max_len = *std::max_element(lens.begin(), lens.end());
    const size_t ws = kcu::PagedAttentionDecodeWorkspaceBytes(2, heads, dim, max_len);
    ASSIGN(dws, d.Zeros<std::byte>(ws));
    kcu::PagedAttentionParams p;
    p.q = dq;
    p.q_token_stride = heads * dim;
    p.k_cache = kc;
    p.v_cache = vc;
    p.block_tables = dtables;
    p.block_table_stride = stride;
    p.seq_lens = dlens;
    p.query_start_loc = dstarts;
    p.num_seqs = 2;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = dim;
    p.block_size = block;
    p.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    p.max_seq_len = max_len;
    p.max_query_len = 0;
    for (size_t s = 0; s + 1 < starts.size(); ++s) {
      p.max_query_len = std::max(p.max_query_len, starts[s + 1] - starts[s]);
    }
    p.out = dout;
    p.out_token_stride = heads * dim;
    p.workspace = dws;
    p.workspace_bytes = ws;
    CHECK_OK(decode         ? kcu::PagedAttentionDecode(p, nullptr)
             : sm90_prefill ? kcu::PrefillAttentionSm90(p, nullptr)
                            : kcu::PagedAttentionPrefill(p, nullptr));
    ASSIGN(got, Download(dout, tokens * heads * dim));
    std::vector<float> want(tokens * heads * dim);
    kernels::cpu::PagedAttentionArgs args;
    args.q = q.data();
    args.q_token_stride = heads * dim;
    args.num_heads = heads;
    args.cache = cache;
    args.query_start_loc = starts;
    args.seq_lens = lens;
    args.block_tables = tables;
    args.block_table_stride = stride;
    args.scale = p.scale;
    args.out = want.data();
    CHECK_OK(ref::PagedAttention(args));
    return Compare(what, FromBf16(got), want, 2 * kBf16Rel, 1e-4f);
  };
  if (sm90_prefill) return run(false, seq_lens, qsl, "attention_prefill (cuda-sm90a)");
  CHECK_OK(run(false, seq_lens, qsl, "attention_prefill"));
  return run(true, {4, 19}, {0, 1, 2}, "attention_decode");
}

absl::Status CheckAttention() { return CheckAttentionWith(false); }
absl::Status CheckSm90Prefill() { return CheckAttentionWith(true); }

absl::Status CheckSampling() {
  Scratch d;
  const int64_t rows = 3, vocab = 37;
  std::vector<float> logits = Random(rows * vocab, 16, 5.0f);
  ASSIGN(dl, d.Upload(logits));
  ASSIGN(dtok, d.Zeros<int32_t>(rows));
  CHECK_OK(kcu::ArgmaxRows(dl, rows, vocab, dtok, nullptr));
  ASSIGN(argmax, Download(dtok, rows));
  std::vector<int32_t> want(rows);
  ref::Argmax(logits.data(), rows, vocab, want.data());
  if (argmax != want) return absl::InternalError("argmax: token differs from the CPU reference");
  // Softmax.
  ASSIGN(dp, d.Zeros<float>(rows * vocab));
  CHECK_OK(kcu::Softmax(dl, rows, vocab, dp, nullptr));
  ASSIGN(probs, Download(dp, rows * vocab));
  std::vector<float> want_p(rows * vocab);
  ref::Softmax(logits.data(), rows, vocab, want_p.data());
  CHECK_OK(Compare("softmax", probs, want_p, 1e-5f, 1e-7f));
  // Sampling: greedy, top-k + temperature, top-p + min-p; the same token as the CPU sampler.
  std::vector<kcu::RowSamplingParams> params(rows);
  params[0].temperature = 0.0f;
  params[1] = {0.8f, 5, 1.0f, 0.0f, 1234, 7};
  params[2] = {1.2f, 0, 0.9f, 0.05f, 99, 3};
  ASSIGN(dparams, d.Upload(params));
  const size_t ws_bytes = kcu::SampleRowsWorkspaceBytes(rows, vocab);
  ASSIGN(dws, d.Zeros<std::byte>(ws_bytes));
  CHECK_OK(kcu::SampleRows(dl, rows, vocab, dparams, dtok, dws, ws_bytes, nullptr));
  ASSIGN(sampled, Download(dtok, rows));
  for (int64_t r = 0; r < rows; ++r) {
    sampling::SamplingParams sp;
    sp.temperature = params[r].temperature;
    sp.top_k = params[r].top_k;
    sp.top_p = params[r].top_p;
    sp.min_p = params[r].min_p;
    sp.seed = params[r].seed;
    absl::StatusOr<sampling::SampleResult> cpu =
        sampling::Sample(absl::MakeConstSpan(logits.data() + r * vocab, vocab), sp,
                         sampling::TokenCounts(), params[r].position);
    if (!cpu.ok()) return cpu.status();
    if (cpu->token != sampled[r]) {
      return absl::InternalError(absl::StrCat("sampling: row ", r, " drew token ", sampled[r],
                                              ", the CPU sampler draws ", cpu->token));
    }
  }
  return absl::OkStatus();
}

// Routing (softmax top-2 of 8; sigmoid with a bias, 4 groups of which 2
// kept, top-3, scaled) and the experts (grouped GEMV path, 3 tokens) against
// the CPU reference. Logits 0.37 apart, so the choices cannot differ.
absl::Status CheckMoe() {
  Scratch d;
  const int T = 3, E = 8, H = 16, I = 8;
  std::vector<float> logits(T * E), bias(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) logits[t * E + e] = 0.37f * ((e * 5 + t * 3) % E) - 1.2f;
  }
  for (int e = 0; e < E; ++e) bias[e] = 0.01f * e;
  ASSIGN(dl, d.Upload(logits));
  ASSIGN(dbias, d.Upload(bias));
  ASSIGN(dids, d.Zeros<int32_t>(T * 3));
  ASSIGN(dw, d.Zeros<float>(T * 3));
  for (const bool sigmoid : {false, true}) {
    kcu::MoeRoutingParams gp;
    kernels::cpu::MoeRoutingParams cp;
    gp.num_experts = cp.num_experts = E;
    gp.top_k = cp.top_k = sigmoid ? 3 : 2;
    gp.renormalize = cp.renormalize = true;
    if (sigmoid) {
      gp.scoring = kcu::MoeScoring::kSigmoidGrouped;
      cp.scoring = kernels::cpu::MoeScoringFunction::kSigmoidGrouped;
      gp.num_groups = cp.num_groups = 4;
      gp.topk_groups = cp.topk_groups = 2;
      gp.scaling_factor = cp.scaling_factor = 2.5f;
      gp.correction_bias = dbias;
      cp.correction_bias = bias.data();
    }
    CHECK_OK(kcu::MoeRoute(dl, T, gp, dids, dw, nullptr));
    ASSIGN(ids, Download(dids, T * gp.top_k));
    ASSIGN(weights, Download(dw, T * gp.top_k));
    std::vector<int32_t> want_ids(T * gp.top_k);
    std::vector<float> want_w(T * gp.top_k);
    kernels::cpu::reference::MoeRoute(logits.data(), T, cp, want_ids.data(), want_w.data());
    if (ids != want_ids) return absl::InternalError("MoE routing: experts differ from the CPU");
    CHECK_OK(Compare("MoE routing weights", weights, want_w, 1e-5f, 1e-6f));
  }
  // The experts of the sigmoid routing above (3 per token).
  std::vector<float> x = Random(T * H, 21), gate_up = Random(E * 2 * I * H, 22, 0.5f),
                     down = Random(E * H * I, 23, 0.5f);
  ASSIGN(ids, Download(dids, T * 3));
  ASSIGN(weights, Download(dw, T * 3));
  ASSIGN(dx, d.Upload(AsBf16(x)));
  ASSIGN(dgu, d.Upload(AsBf16(gate_up)));
  ASSIGN(ddown, d.Upload(AsBf16(down)));
  ASSIGN(dout, d.Zeros<Bf16>(T * H));
  kcu::MoeExpertsArgs a;
  a.x = dx;
  a.num_tokens = T;
  a.ids = dids;
  a.weights = dw;
  a.top_k = 3;
  a.experts = {dgu, ddown, E, H, I};
  a.out = dout;
  a.max_tokens = T;
  a.workspace_bytes = kcu::MoeExpertsWorkspaceBytes(T, 3, a.experts);
  ASSIGN(dws, d.Zeros<std::byte>(a.workspace_bytes));
  a.workspace = dws;
  CHECK_OK(kcu::MoeExperts(a, nullptr));
  ASSIGN(out, Download(dout, T * H));
  std::vector<kernels::cpu::WeightMatrix> gu_m, down_m;
  for (int e = 0; e < E; ++e) {
    gu_m.push_back({gate_up.data() + e * 2 * I * H, kernels::cpu::DType::kF32, 2 * I, H});
    down_m.push_back({down.data() + e * H * I, kernels::cpu::DType::kF32, H, I});
  }
  std::vector<float> want(T * H);
  kernels::cpu::MoeExpertsArgs c;
  c.x = x.data();
  c.num_tokens = T;
  c.hidden = H;
  c.gate_up = gu_m;
  c.down = down_m;
  c.ids = ids.data();
  c.weights = weights.data();
  c.top_k = 3;
  c.out = want.data();
  CHECK_OK(kernels::cpu::ValidateMoeExperts(c));
  kernels::cpu::reference::MoeExperts(c);
  // The GPU rounds gate, up and each expert's output to bf16 (as the dense
  // path and transformers do), the reference does not.
  return Compare("MoE experts", FromBf16(out), want, 4 * kBf16Rel, 1e-3f);
}

}  // namespace

absl::Status PreflightCudaKernels(const kernels::DeviceDescription& device,
                                  const kernels::SelectionReport& report) {
  struct Check {
    std::vector<kernels::Op> ops;
    absl::Status (*run)();
    std::string_view backend = {};  // runs when chosen; empty: the cuda and cublas candidates
  };
  const Check checks[] = {
      {{kernels::Op::kGemm}, &CheckGemm},
      {{kernels::Op::kEmbedding, kernels::Op::kRmsNorm, kernels::Op::kSiluMul},
       &CheckNormsAndElementwise},
      {{kernels::Op::kRope}, &CheckRope},
      {{kernels::Op::kKvCacheWrite, kernels::Op::kAttentionPrefill, kernels::Op::kAttentionDecode},
       &CheckAttention},
      {{kernels::Op::kAttentionPrefill}, &CheckSm90Prefill, kernels::kCudaSm90aBackend},
      {{kernels::Op::kLogitsProcessing, kernels::Op::kSampling}, &CheckSampling},
      {{kernels::Op::kMoeRouting, kernels::Op::kMoeExperts}, &CheckMoe},
  };
  if (absl::Status s = kcu::SetDevice(device.ordinal); !s.ok()) return s;
  for (const Check& check : checks) {
    bool on_gpu = false;
    for (kernels::Op op : check.ops) {
      const kernels::Selection* sel = report.Find(op);
      on_gpu |= sel != nullptr &&
                (check.backend.empty() ? sel->chosen == "cuda" || sel->chosen == "cublas"
                                       : sel->chosen == check.backend);
    }
    if (!on_gpu) continue;
    absl::Status s = check.run();
    if (s.ok()) continue;
    const kernels::GpuInfo& gpu = *device.gpu;
    const bool no_image = s.message().find("no kernel image") != absl::string_view::npos ||
                          s.message().find("NoKernelImage") != absl::string_view::npos;
    return absl::FailedPreconditionError(absl::StrCat(
        "preflight failed on ", device.Summary(), ": ", s.message(), ". Device SM ",
        gpu.arch.ToString(), "; this binary's images: ", device.build.ImageList(), " (nvcc ",
        device.build.nvcc_version, "); driver CUDA ",
        kernels::arch::CudaVersionString(gpu.driver_version), ", runtime CUDA ",
        kernels::arch::CudaVersionString(gpu.runtime_version), ". ",
        no_image ? absl::StrCat("Fix: rebuild with sm_", gpu.arch.major, gpu.arch.minor,
                                " in -DTESSERA_CUDA_ARCHS")
        : !check.backend.empty()
            ? absl::StrCat("Fix: this is a bug of the ", std::string(check.backend),
                           " kernel on this device; keep prefill on the portable kernel with "
                           "--attention_backend=cuda and report the message")
            : std::string("Fix: this is a kernel bug on this device; run with --device=cpu "
                          "and report the message")));
  }
  return absl::OkStatus();
}

}  // namespace tessera::runner
