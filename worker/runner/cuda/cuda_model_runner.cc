#include "worker/runner/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gather_rows.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_slot_copy.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/silu_mul.h"
#include "kernels/cuda/top_one.h"
#include "kernels/cuda_backend.h"
#include "worker/model/rope.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;
using kcu::DeviceBuffer;

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

// Largest token tree per sequence chunk past its trunk (one 64-bit ancestor
// mask per token).
constexpr int kMaxTreeTokens = 64;

// The trunk of a chunk with these tree parents: the longest chain prefix
// that every token of the chunk descends from (the root that follows the
// context, and any single-child run below it); q_len for a chain.
int TreeTrunk(const int32_t* parents, int q_len) {
  int chain = 0;
  while (chain < q_len && parents[chain] == chain - 1) ++chain;
  if (chain == q_len) return q_len;
  // attach[t]: t's first ancestor inside the chain prefix (-1: the context).
  std::vector<int> attach(static_cast<size_t>(q_len));
  int trunk = chain;
  for (int t = chain; t < q_len; ++t) {
    const int parent = parents[t];
    attach[t] = parent < chain ? parent : attach[parent];
    trunk = std::min(trunk, attach[t] + 1);
  }
  return trunk;
}

// Smallest power of two >= n (n >= 1).
int64_t RoundUpPow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Row i of the result is row order[i] of `rows` (rows.size() / order.size()
// values each).
template <class T>
std::vector<T> PermuteRows(const std::vector<T>& rows, const std::vector<int64_t>& order) {
  const size_t len = rows.size() / order.size();
  std::vector<T> out(rows.size());
  for (size_t i = 0; i < order.size(); ++i) {
    std::copy_n(rows.begin() + order[i] * len, len, out.begin() + i * len);
  }
  return out;
}

// The fused q/k/v rows (q_rows + k_rows + k_rows, heads of head_dim rows)
// with every q and k head's rows in RoPE order (kernels/cuda/gemv.h
// GemvRopeRow) and the v rows as they are: entry i is the source row.
std::vector<int64_t> RopeRowOrder(int64_t q_rows, int64_t k_rows, int64_t head_dim) {
  std::vector<int64_t> order(q_rows + 2 * k_rows);
  for (int64_t r = 0; r < static_cast<int64_t>(order.size()); ++r) order[r] = r;
  for (int64_t base = 0; base < q_rows + k_rows; base += head_dim) {
    for (int64_t f = 0; f < head_dim; ++f) order[base + kcu::GemvRopeRow(f, head_dim)] = base + f;
  }
  return order;
}

// The fused [gate; up] rows (inter each) in the gate/up GEMV order
// (kernels/cuda/gemv.h GemvGateUpRow): entry i is the source row.
std::vector<int64_t> GateUpRowOrder(int64_t inter) {
  std::vector<int64_t> order(2 * inter);
  for (int64_t r = 0; r < 2 * inter; ++r) order[kcu::GemvGateUpRow(r, inter)] = r;
  return order;
}

absl::StatusOr<DeviceBuffer> Alloc(size_t bytes, std::string_view what) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating ", std::string(what), " (",
                                                     bytes >> 20,
                                                     " MiB) on the GPU: ", b.status().ToString()));
  }
  return b;
}

// Grows `buffer` to at least `bytes`: scratch that only some steps need
// (sampling), allocated when the first such step comes. The old buffer goes
// only once `stream` has finished with it.
absl::Status GrowScratch(DeviceBuffer* buffer, size_t bytes, std::string_view what,
                         kcu::CudaStream stream) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  RETURN_IF_ERROR(kcu::Synchronize(stream));
  *buffer = DeviceBuffer();
  absl::StatusOr<DeviceBuffer> b = Alloc(bytes, what);
  if (!b.ok()) return b.status();
  *buffer = std::move(*b);
  return absl::OkStatus();
}

// Host bytes of a tensor as bf16 (a copy for bf16, a conversion otherwise).
absl::StatusOr<std::vector<Bf16>> ToBf16(const model::TensorView& t) {
  std::vector<Bf16> out(static_cast<size_t>(t.num_elements()));
  if (t.dtype == model::DType::kBF16) {
    std::memcpy(out.data(), t.data, t.size_bytes);
    return out;
  }
  absl::StatusOr<std::vector<float>> f = model::ToFloat32(t);
  if (!f.ok()) return f.status();
  if (auto s = kcu::ConvertToBf16(f->data(), f->size(), &out); !s.ok()) return s;
  return out;
}

// Rows [start, start + n) of a 2-D tensor (a view into the same bytes).
model::TensorView RowSlice(const model::TensorView& t, int64_t start, int64_t n) {
  model::TensorView v = t;
  const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const size_t elem = t.size_bytes / static_cast<size_t>(std::max<int64_t>(1, t.num_elements()));
  v.data = t.data + static_cast<size_t>(start * cols) * elem;
  v.shape[0] = n;
  v.size_bytes = static_cast<size_t>(n * cols) * elem;
  return v;
}

// Columns [start, start + n) of a 2-D tensor, as bf16 (strided copy).
absl::StatusOr<std::vector<Bf16>> ColumnSliceBf16(const model::TensorView& t, int64_t start,
                                                  int64_t n) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<Bf16> out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r) {
    absl::StatusOr<std::vector<Bf16>> row = ToBf16(RowSlice(t, r, 1));
    if (!row.ok()) return row.status();
    std::memcpy(out.data() + r * n, row->data() + start, static_cast<size_t>(n) * sizeof(Bf16));
  }
  (void)cols;
  return out;
}

// A 1-D tensor's elements [start, start + n).
model::TensorView VectorSlice(const model::TensorView& t, int64_t start, int64_t n) {
  model::TensorView v = t;
  const size_t elem = t.size_bytes / static_cast<size_t>(std::max<int64_t>(1, t.num_elements()));
  v.data = t.data + static_cast<size_t>(start) * elem;
  v.shape[0] = n;
  v.size_bytes = static_cast<size_t>(n) * elem;
  return v;
}

}  // namespace

struct CudaModelRunner::Graph {
  kcu::CudaGraph graph;
};

struct CudaModelRunner::Impl {
  struct Layer {
    DeviceBuffer qkv_w, o_w, gate_up_w, down_w;
    DeviceBuffer qkv_b, o_b, gate_up_b, down_b;  // fp32; empty = none
    DeviceBuffer input_norm, post_norm, q_norm, k_norm;
  };
  int ordinal = 0;
  // This rank's sizes (the whole model without a shard).
  int64_t heads = 0, kv_heads = 0, inter = 0, vocab = 0, vocab_start = 0;
  bool add_row_bias = true;
  // The q and k heads' rows of qkv_w (and qkv_b) in RoPE order (gemv.h
  // GemvRopeRow), so that steps of <= 8 tokens rotate in the qkv GEMV's
  // epilogue; models with q/k norms keep the normal order.
  bool qkv_rope_order = false;
  // Decode steps the GEMV does not rotate: RoPE in attention (DecodeRope)
  // or, false (SetRopeInAttention, benchmarks), in the Rope kernel.
  bool rope_in_attention = true;
  // gate_up_w (and gate_up_b) rows in the gate/up GEMV order (gemv.h
  // GemvGateUpRow) when the intermediate size is a multiple of 4, so that
  // one-token steps run SiLU·mul in the staged GEMV's epilogue; SiluMul
  // reads that order otherwise.
  bool gate_up_interleaved = false;
  int rank = 0;
  kcu::NcclGroup* nccl = nullptr;  // null: one rank
  kcu::Stream stream;
  // Recorded after the logits of a ForwardToDevice step (LogitsSlice::ready).
  kcu::Event logits_ready;
  std::unique_ptr<kcu::GemmContext> gemm;
  DeviceBuffer embed, lm_head_own, final_norm, inv_freq;
  const Bf16* lm_head = nullptr;
  std::vector<Layer> layers;
  DeviceBuffer k_cache, v_cache;  // [layers][blocks, block_size, kv_heads, head_dim]

  // Batch inputs, one packed buffer at fixed offsets (one copy per step).
  // Token-tree ancestor masks (uint64 per token) and trunk lengths (int32
  // per sequence) follow the used part of the block tables, at off_tree and
  // off_tree_prefix, so the same copy carries them.
  DeviceBuffer meta;
  std::vector<std::byte> host_meta;
  size_t off_tokens = 0, off_positions = 0, off_slots = 0, off_qsl = 0, off_seq_lens = 0,
         off_logits_idx = 0, off_block_tables = 0, off_tree = 0, off_tree_prefix = 0;
  // CopyKvSlots: the (from, to) slot pairs, staged in one copy.
  DeviceBuffer kv_copy_pairs;
  std::vector<int64_t> host_kv_copy_pairs;
  int64_t max_blocks_per_seq = 0;
  int64_t table_stride = 0;  // block-table stride of the staged batch

  // Activations.
  DeviceBuffer residual, xb, qkv, attn, delta, gate_up, act, rows, logits, argmax, top_values,
      top_workspace;
  DeviceBuffer sampling_params;   // kcu::RowSamplingParams per logits row
  DeviceBuffer sample_workspace;  // kcu::SampleRows' weights (first sampled step)
  // Every rank's logits slice side by side, [rows, vocab] (SampleSlices;
  // the first sampled step of a tensor-parallel group, grown as needed).
  DeviceBuffer gathered_logits;
  DeviceBuffer attn_workspace;
  int64_t max_logits_rows = 0;

  template <class T>
  T* MetaPtr(size_t off) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(meta.data()) + off);
  }
};

CudaModelRunner::CudaModelRunner(model::ModelConfig config, CudaRunnerOptions options)
    : config_(std::move(config)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

CudaModelRunner::~CudaModelRunner() {
  if (impl_) (void)kcu::SetDevice(impl_->ordinal);
  graphs_.clear();
}

absl::Status CudaModelRunner::Init(const kernels::DeviceDescription& device) {
  if (device.kind != kernels::DeviceKind::kCuda || !device.gpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA runner needs a CUDA device; got ", device.Summary()));
  }
  if (options_.block_size < 1 || options_.max_num_tokens < 1 || options_.max_num_seqs < 1) {
    return absl::InvalidArgumentError("block_size, max_num_tokens and max_num_seqs must be >= 1");
  }
  if (config_.head_dim != 64 && config_.head_dim != 128 && config_.head_dim != 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA attention kernels support head_dim 64, 128 and 256; this model has ",
                     config_.head_dim, " (run it with --device=cpu)"));
  }
  impl_->ordinal = device.ordinal;
  Impl& m = *impl_;
  const parallel::ShardPlan plan = options_.shard ? *options_.shard : parallel::FullPlan(config_);
  if (plan.sharded() && options_.nccl == nullptr) {
    return absl::InvalidArgumentError("a sharded CUDA runner needs an NCCL group");
  }
  m.heads = plan.q_heads.size;
  m.kv_heads = plan.kv_heads.size;
  m.inter = plan.intermediate.size;
  m.vocab = plan.vocab.size;
  m.vocab_start = plan.vocab.start;
  m.add_row_bias = plan.add_row_bias;
  m.rank = plan.rank;
  m.nccl = plan.sharded() ? options_.nccl : nullptr;
  RETURN_IF_ERROR(kcu::SetDevice(device.ordinal));
  if (options_.prefill_attention_backend == kernels::kCudaSm90aBackend) {
    std::string why;
    if (!kcu::PrefillAttentionSm90Available(&why)) {
      return absl::FailedPreconditionError(
          absl::StrCat("prefill attention backend ", options_.prefill_attention_backend,
                       " cannot run on ", device.Summary(), ": ", why));
    }
  } else if (options_.prefill_attention_backend != kernels::kCudaBackend) {
    return absl::InvalidArgumentError(absl::StrCat("unknown prefill attention backend '",
                                                   options_.prefill_attention_backend,
                                                   "' (cuda or cuda-sm90a)"));
  }
  absl::StatusOr<kcu::Stream> stream = kcu::Stream::Create();
  if (!stream.ok()) return stream.status();
  impl_->stream = std::move(*stream);
  absl::StatusOr<kcu::Event> ready = kcu::Event::Create(/*timing=*/false);
  if (!ready.ok()) return ready.status();
  impl_->logits_ready = std::move(*ready);
  absl::StatusOr<std::unique_ptr<kcu::GemmContext>> gemm = kcu::GemmContext::Create();
  if (!gemm.ok()) return gemm.status();
  impl_->gemm = std::move(*gemm);
  impl_->gemm->SetUseStagedGemv(options_.staged_gemv);
  impl_->gemm->SetAutotuneCandidates(options_.gemm_autotune_candidates);
  if (options_.gemm_tuning != nullptr) impl_->gemm->ShareTuning(options_.gemm_tuning);
  impl_->layers.resize(config_.num_hidden_layers);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const model::LoadedModel* model, const kernels::DeviceDescription& device,
    CudaRunnerOptions options) {
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(model->config, std::move(options)));
  RETURN_IF_ERROR(r->Init(device));
  Impl& m = *r->impl_;
  const model::ModelWeights& w = model->weights;

  // One upload per (possibly fused) tensor list.
  // With `order`, row i of the upload is row (*order)[i] of the parts.
  auto upload_bf16 = [&](std::initializer_list<const model::TensorView*> parts, DeviceBuffer* out,
                         std::string_view what,
                         const std::vector<int64_t>* order = nullptr) -> absl::Status {
    std::vector<Bf16> host;
    for (const model::TensorView* p : parts) {
      absl::StatusOr<std::vector<Bf16>> b = ToBf16(*p);
      if (!b.ok()) return b.status();
      host.insert(host.end(), b->begin(), b->end());
    }
    if (order != nullptr) host = PermuteRows(host, *order);
    absl::StatusOr<DeviceBuffer> buf = Alloc(host.size() * sizeof(Bf16), what);
    if (!buf.ok()) return buf.status();
    RETURN_IF_ERROR(kcu::CopyToDevice(buf->data(), host.data(), host.size() * sizeof(Bf16)));
    r->weight_bytes_ += static_cast<int64_t>(host.size() * sizeof(Bf16));
    *out = std::move(*buf);
    return absl::OkStatus();
  };
  auto upload_f32 = [&](std::vector<const model::TensorView*> parts, DeviceBuffer* out,
                        std::string_view what,
                        const std::vector<int64_t>* order = nullptr) -> absl::Status {
    std::vector<float> host;
    for (const model::TensorView* p : parts) {
      absl::StatusOr<std::vector<float>> f = model::ToFloat32(*p);
      if (!f.ok()) return f.status();
      host.insert(host.end(), f->begin(), f->end());
    }
    if (order != nullptr) host = PermuteRows(host, *order);
    absl::StatusOr<DeviceBuffer> buf = Alloc(host.size() * sizeof(float), what);
    if (!buf.ok()) return buf.status();
    RETURN_IF_ERROR(kcu::CopyToDevice(buf->data(), host.data(), host.size() * sizeof(float)));
    *out = std::move(*buf);
    return absl::OkStatus();
  };

  const parallel::ShardPlan plan =
      r->options_.shard ? *r->options_.shard : parallel::FullPlan(r->config_);
  const int64_t D = r->config_.head_dim;
  const model::TensorView embed = RowSlice(w.embed_tokens, plan.vocab.start, plan.vocab.size);
  RETURN_IF_ERROR(upload_bf16({&embed}, &m.embed, "embed_tokens"));
  if (w.lm_head_tied) {
    m.lm_head = m.embed.as<Bf16>();
  } else {
    const model::TensorView head = RowSlice(w.lm_head, plan.vocab.start, plan.vocab.size);
    RETURN_IF_ERROR(upload_bf16({&head}, &m.lm_head_own, "lm_head"));
    m.lm_head = m.lm_head_own.as<Bf16>();
  }
  RETURN_IF_ERROR(upload_f32({&w.norm}, &m.final_norm, "norm"));
  absl::StatusOr<std::vector<float>> inv_freq = model::RopeInverseFrequencies(r->config_);
  if (!inv_freq.ok()) return inv_freq.status();
  absl::StatusOr<DeviceBuffer> freq = Alloc(inv_freq->size() * sizeof(float), "inv_freq");
  if (!freq.ok()) return freq.status();
  RETURN_IF_ERROR(
      kcu::CopyToDevice(freq->data(), inv_freq->data(), inv_freq->size() * sizeof(float)));
  m.inv_freq = std::move(*freq);

  // A column slice uploaded as bf16 (row-parallel o_proj / down_proj).
  auto upload_columns = [&](const model::TensorView& t, parallel::Range cols, DeviceBuffer* out,
                            std::string_view what) -> absl::Status {
    absl::StatusOr<std::vector<Bf16>> host = ColumnSliceBf16(t, cols.start, cols.size);
    if (!host.ok()) return host.status();
    absl::StatusOr<DeviceBuffer> buf = Alloc(host->size() * sizeof(Bf16), what);
    if (!buf.ok()) return buf.status();
    RETURN_IF_ERROR(kcu::CopyToDevice(buf->data(), host->data(), host->size() * sizeof(Bf16)));
    r->weight_bytes_ += static_cast<int64_t>(host->size() * sizeof(Bf16));
    *out = std::move(*buf);
    return absl::OkStatus();
  };
  const parallel::Range q_rows{plan.q_heads.start * D, plan.q_heads.size * D};
  const parallel::Range kv_rows{plan.kv_heads.start * D, plan.kv_heads.size * D};
  m.qkv_rope_order = !r->config_.qk_norm && D % 16 == 0;
  const std::vector<int64_t> qkv_order =
      m.qkv_rope_order ? RopeRowOrder(q_rows.size, kv_rows.size, D) : std::vector<int64_t>{};
  const std::vector<int64_t>* qkv_rows = m.qkv_rope_order ? &qkv_order : nullptr;
  m.gate_up_interleaved = plan.intermediate.size % 4 == 0;
  const std::vector<int64_t> gate_up_order =
      m.gate_up_interleaved ? GateUpRowOrder(plan.intermediate.size) : std::vector<int64_t>{};
  const std::vector<int64_t>* gate_up_rows = m.gate_up_interleaved ? &gate_up_order : nullptr;
  for (int64_t i = 0; i < r->config_.num_hidden_layers; ++i) {
    const model::LayerWeights& lw = w.layers[i];
    Impl::Layer& l = m.layers[i];
    const std::string name = absl::StrCat("layer ", i);
    const model::TensorView q = RowSlice(lw.q_proj, q_rows.start, q_rows.size);
    const model::TensorView k = RowSlice(lw.k_proj, kv_rows.start, kv_rows.size);
    const model::TensorView v = RowSlice(lw.v_proj, kv_rows.start, kv_rows.size);
    if (m.qkv_rope_order && (lw.q_norm || lw.k_norm)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has q/k norms, but the config does not say qk_norm"));
    }
    RETURN_IF_ERROR(upload_bf16({&q, &k, &v}, &l.qkv_w, name, qkv_rows));
    if (plan.sharded()) {
      RETURN_IF_ERROR(upload_columns(lw.o_proj, q_rows, &l.o_w, name));
    } else {
      RETURN_IF_ERROR(upload_bf16({&lw.o_proj}, &l.o_w, name));
    }
    const model::TensorView gate =
        RowSlice(lw.gate_proj, plan.intermediate.start, plan.intermediate.size);
    const model::TensorView up =
        RowSlice(lw.up_proj, plan.intermediate.start, plan.intermediate.size);
    RETURN_IF_ERROR(upload_bf16({&gate, &up}, &l.gate_up_w, name, gate_up_rows));
    if (plan.sharded()) {
      RETURN_IF_ERROR(upload_columns(lw.down_proj, plan.intermediate, &l.down_w, name));
    } else {
      RETURN_IF_ERROR(upload_bf16({&lw.down_proj}, &l.down_w, name));
    }
    RETURN_IF_ERROR(upload_f32({&lw.input_layernorm}, &l.input_norm, name));
    RETURN_IF_ERROR(upload_f32({&lw.post_attention_layernorm}, &l.post_norm, name));
    if (lw.q_norm) RETURN_IF_ERROR(upload_f32({&*lw.q_norm}, &l.q_norm, name));
    if (lw.k_norm) RETURN_IF_ERROR(upload_f32({&*lw.k_norm}, &l.k_norm, name));
    if (lw.q_bias) {
      const model::TensorView qb = VectorSlice(*lw.q_bias, q_rows.start, q_rows.size);
      const model::TensorView kb = VectorSlice(*lw.k_bias, kv_rows.start, kv_rows.size);
      const model::TensorView vb = VectorSlice(*lw.v_bias, kv_rows.start, kv_rows.size);
      RETURN_IF_ERROR(upload_f32({&qb, &kb, &vb}, &l.qkv_b, name, qkv_rows));
    }
    if (lw.o_bias && plan.add_row_bias) RETURN_IF_ERROR(upload_f32({&*lw.o_bias}, &l.o_b, name));
    if (lw.gate_bias) {
      const model::TensorView gb =
          VectorSlice(*lw.gate_bias, plan.intermediate.start, plan.intermediate.size);
      const model::TensorView ub =
          VectorSlice(*lw.up_bias, plan.intermediate.start, plan.intermediate.size);
      RETURN_IF_ERROR(upload_f32({&gb, &ub}, &l.gate_up_b, name, gate_up_rows));
    }
    if (lw.down_bias && plan.add_row_bias) {
      RETURN_IF_ERROR(upload_f32({&*lw.down_bias}, &l.down_b, name));
    }
  }
  RETURN_IF_ERROR(r->AllocateCacheAndWorkspace());
  return r;
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::CreateWithRandomWeights(
    const model::ModelConfig& config, const kernels::DeviceDescription& device,
    CudaRunnerOptions options, uint64_t seed) {
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(config, std::move(options)));
  RETURN_IF_ERROR(r->Init(device));
  Impl& m = *r->impl_;
  const model::ModelConfig& c = r->config_;
  kcu::CudaStream st = m.stream.get();
  uint64_t stream_id = seed;
  auto random = [&](int64_t elems, DeviceBuffer* out, std::string_view what) -> absl::Status {
    absl::StatusOr<DeviceBuffer> buf = Alloc(elems * sizeof(Bf16), what);
    if (!buf.ok()) return buf.status();
    RETURN_IF_ERROR(kcu::FillRandomBf16(buf->as<Bf16>(), elems, ++stream_id, 0.03f, st));
    r->weight_bytes_ += elems * static_cast<int64_t>(sizeof(Bf16));
    *out = std::move(*buf);
    return absl::OkStatus();
  };
  auto ones = [&](int64_t elems, DeviceBuffer* out) -> absl::Status {
    absl::StatusOr<DeviceBuffer> buf = Alloc(elems * sizeof(float), "norm");
    if (!buf.ok()) return buf.status();
    RETURN_IF_ERROR(kcu::FillConstantF32(buf->as<float>(), elems, 1.0f, st));
    *out = std::move(*buf);
    return absl::OkStatus();
  };
  const int64_t H = c.hidden_size, Q = m.heads * c.head_dim, K = m.kv_heads * c.head_dim,
                I = m.inter;
  RETURN_IF_ERROR(random(m.vocab * H, &m.embed, "embed_tokens"));
  if (c.tie_word_embeddings) {
    m.lm_head = m.embed.as<Bf16>();
  } else {
    RETURN_IF_ERROR(random(m.vocab * H, &m.lm_head_own, "lm_head"));
    m.lm_head = m.lm_head_own.as<Bf16>();
  }
  RETURN_IF_ERROR(ones(H, &m.final_norm));
  absl::StatusOr<std::vector<float>> inv_freq = model::RopeInverseFrequencies(c);
  if (!inv_freq.ok()) return inv_freq.status();
  absl::StatusOr<DeviceBuffer> freq = Alloc(inv_freq->size() * sizeof(float), "inv_freq");
  if (!freq.ok()) return freq.status();
  RETURN_IF_ERROR(
      kcu::CopyToDevice(freq->data(), inv_freq->data(), inv_freq->size() * sizeof(float)));
  m.inv_freq = std::move(*freq);
  m.qkv_rope_order = !c.qk_norm && c.head_dim % 16 == 0;  // random rows: any order
  m.gate_up_interleaved = I % 4 == 0;
  for (Impl::Layer& l : m.layers) {
    RETURN_IF_ERROR(random((Q + 2 * K) * H, &l.qkv_w, "qkv"));
    RETURN_IF_ERROR(random(H * Q, &l.o_w, "o_proj"));
    RETURN_IF_ERROR(random(2 * I * H, &l.gate_up_w, "gate_up"));
    RETURN_IF_ERROR(random(H * I, &l.down_w, "down_proj"));
    RETURN_IF_ERROR(ones(H, &l.input_norm));
    RETURN_IF_ERROR(ones(H, &l.post_norm));
    if (c.qk_norm) {
      RETURN_IF_ERROR(ones(c.head_dim, &l.q_norm));
      RETURN_IF_ERROR(ones(c.head_dim, &l.k_norm));
    }
  }
  RETURN_IF_ERROR(kcu::Synchronize(st));
  RETURN_IF_ERROR(r->AllocateCacheAndWorkspace());
  return r;
}

absl::Status CudaModelRunner::AllocateCacheAndWorkspace() {
  Impl& m = *impl_;
  const model::ModelConfig& c = config_;
  const int64_t T = options_.max_num_tokens, S = options_.max_num_seqs;
  const int64_t H = c.hidden_size, Q = m.heads * c.head_dim, K = m.kv_heads * c.head_dim,
                I = m.inter;
  m.max_blocks_per_seq =
      (c.max_position_embeddings + options_.block_size - 1) / options_.block_size;
  // Rows that want logits: one per sequence, more with speculative tokens.
  m.max_logits_rows = std::min<int64_t>(T, std::max<int64_t>(256, 8 * S));

  // Packed batch inputs (8-byte aligned sections).
  auto align8 = [](size_t n) { return (n + 7) & ~size_t{7}; };
  size_t off = 0;
  m.off_tokens = off;
  off = align8(off + T * sizeof(int32_t));
  m.off_positions = off;
  off = align8(off + T * sizeof(int32_t));
  m.off_slots = off;
  off = align8(off + T * sizeof(int64_t));
  m.off_qsl = off;
  off = align8(off + (S + 1) * sizeof(int32_t));
  m.off_seq_lens = off;
  off = align8(off + S * sizeof(int32_t));
  m.off_logits_idx = off;
  off = align8(off + m.max_logits_rows * sizeof(int32_t));
  m.off_block_tables = off;
  off = align8(off + S * m.max_blocks_per_seq * sizeof(int32_t));
  off += T * sizeof(uint64_t) + align8(S * sizeof(int32_t)) + 8;  // tree masks and trunks
  m.host_meta.assign(off, std::byte{0});

  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
    const char* what;
  };
  const Want wants[] = {
      {&m.meta, off, "batch inputs"},
      {&m.residual, T * H * sizeof(float), "residual"},
      {&m.xb, T * H * sizeof(Bf16), "activations"},
      {&m.qkv, T * (Q + 2 * K) * sizeof(Bf16), "qkv"},
      {&m.attn, T * Q * sizeof(Bf16), "attention output"},
      {&m.delta, T * H * sizeof(Bf16), "activations"},
      {&m.gate_up, T * 2 * I * sizeof(Bf16), "gate_up"},
      {&m.act, T * I * sizeof(Bf16), "mlp activations"},
      {&m.rows, m.max_logits_rows * H * sizeof(Bf16), "logits rows"},
      {&m.logits, m.max_logits_rows * m.vocab * sizeof(float), "logits"},
      {&m.argmax, m.max_logits_rows * sizeof(int32_t), "argmax"},
      {&m.top_values, m.max_logits_rows * sizeof(float), "argmax values"},
      {&m.top_workspace, kcu::TopOneWorkspaceBytes(m.max_logits_rows), "argmax workspace"},
      {&m.sampling_params, m.max_logits_rows * sizeof(kcu::RowSamplingParams), "sampling params"},
  };
  for (const Want& want : wants) {
    absl::StatusOr<DeviceBuffer> b = Alloc(want.bytes, want.what);
    if (!b.ok()) return b.status();
    *want.buf = std::move(*b);
  }
  // Decode workspace for the largest graph bucket at a moderate context;
  // Execute() grows it (dropping captured graphs) when a step needs more.
  const size_t ws = kcu::PagedAttentionDecodeWorkspaceBytes(
      static_cast<int>(S), static_cast<int>(m.heads), static_cast<int>(c.head_dim),
      static_cast<int>(std::min<int64_t>(c.max_position_embeddings, 8192)));
  absl::StatusOr<DeviceBuffer> wsb = Alloc(std::max<size_t>(ws, 256), "attention workspace");
  if (!wsb.ok()) return wsb.status();
  m.attn_workspace = std::move(*wsb);

  // The KV cache: what is asked, or a fraction of what is left.
  const int64_t bytes_per_block =
      int64_t{2} * c.num_hidden_layers * options_.block_size * K * int64_t{sizeof(Bf16)};
  int64_t blocks = options_.num_kv_blocks;
  if (blocks <= 0) {
    size_t free_bytes = 0, total_bytes = 0;
    if (!kcu::CurrentDeviceMemory(&free_bytes, &total_bytes)) {
      return absl::InternalError("cudaMemGetInfo failed");
    }
    const double budget = static_cast<double>(free_bytes) * options_.gpu_memory_fraction;
    blocks = static_cast<int64_t>(budget / static_cast<double>(bytes_per_block));
    if (blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no GPU memory left for the KV cache: ", free_bytes >> 20, " MiB free after ",
          weight_bytes_ >> 20, " MiB of weights; one block needs ", bytes_per_block >> 10, " KiB"));
    }
  }
  num_kv_blocks_ = blocks;
  const size_t half = static_cast<size_t>(bytes_per_block / 2) * static_cast<size_t>(blocks);
  absl::StatusOr<DeviceBuffer> kc = Alloc(half, "K cache");
  if (!kc.ok()) return kc.status();
  absl::StatusOr<DeviceBuffer> vc = Alloc(half, "V cache");
  if (!vc.ok()) return vc.status();
  m.k_cache = std::move(*kc);
  m.v_cache = std::move(*vc);
  kcu::CudaStream st = m.stream.get();
  RETURN_IF_ERROR(kcu::MemsetDevice(m.k_cache.data(), 0, half, st));
  RETURN_IF_ERROR(kcu::MemsetDevice(m.v_cache.data(), 0, half, st));
  RETURN_IF_ERROR(kcu::Synchronize(st));
  LogInfo("cuda runner ready", {{"weights_mib", weight_bytes_ >> 20},
                                {"kv_blocks", blocks},
                                {"kv_cache_mib", static_cast<int64_t>((2 * half) >> 20)},
                                {"block_size", options_.block_size}});
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ValidateBatch(const ForwardBatch& b) const {
  if (b.num_tokens() > options_.max_num_tokens || b.num_seqs() > options_.max_num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", b.num_tokens(), " tokens in ", b.num_seqs(),
                     " sequences exceeds the runner's limits (", options_.max_num_tokens,
                     " tokens, ", options_.max_num_seqs, " sequences)"));
  }
  for (int i = 0; i < b.num_seqs() && i + 1 < static_cast<int>(b.query_start_loc.size()); ++i) {
    if (b.query_start_loc[i + 1] == b.query_start_loc[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, " has no new tokens; the CUDA kernels need at least one"));
    }
  }
  RETURN_IF_ERROR(ValidateForwardBatch(
      b, {config_.vocab_size, config_.max_position_embeddings, options_.block_size, num_kv_blocks_,
          /*tree_attention=*/true}));
  if (b.tree_parents.empty()) return absl::OkStatus();
  // Ancestor masks are 64 bits: a chunk holds at most 64 tokens past its
  // trunk (a chain of any length is plain causal).
  for (int i = 0; i < b.num_seqs(); ++i) {
    const int begin = b.query_start_loc[i], q_len = b.query_start_loc[i + 1] - begin;
    const int branching = q_len - TreeTrunk(b.tree_parents.data() + begin, q_len);
    if (branching > kMaxTreeTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": a token tree of ", branching,
                       " tokens below its trunk; the CUDA runner verifies trees of at most ",
                       kMaxTreeTokens, " (plus the chain every token descends from)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Stage(const ForwardBatch& b, int64_t padded_tokens, int padded_seqs,
                                    int context, bool* tree) {
  Impl& m = *impl_;
  std::byte* base = m.host_meta.data();
  auto put = [&](size_t off, const void* src, size_t bytes) {
    std::memcpy(base + off, src, bytes);
  };
  const int n = b.num_tokens(), s = b.num_seqs();
  put(m.off_tokens, b.token_ids.data(), n * sizeof(int32_t));
  put(m.off_positions, b.positions.data(), n * sizeof(int32_t));
  put(m.off_slots, b.slot_mapping.data(), n * sizeof(int64_t));
  put(m.off_qsl, b.query_start_loc.data(), (s + 1) * sizeof(int32_t));
  put(m.off_seq_lens, b.seq_lens.data(), s * sizeof(int32_t));
  const int64_t r = static_cast<int64_t>(b.logits_indices.size());
  put(m.off_logits_idx, b.logits_indices.data(), std::min(r, m.max_logits_rows) * sizeof(int32_t));
  int32_t* tables = reinterpret_cast<int32_t*>(base + m.off_block_tables);
  // The staged table covers `context` positions (the step's longest sequence,
  // or the graph bucket's bound), not the model's whole context.
  const int64_t stride = std::min<int64_t>(
      m.max_blocks_per_seq, (context + options_.block_size - 1) / options_.block_size);
  m.table_stride = stride;
  const int64_t copy = std::min<int64_t>(stride, b.block_table_stride);
  for (int i = 0; i < s; ++i) {
    std::memcpy(tables + i * stride, b.block_tables.data() + i * b.block_table_stride,
                copy * sizeof(int32_t));
    std::fill(tables + i * stride + copy, tables + (i + 1) * stride, 0);
  }
  // Padding rows (decode graphs): one token at position 0 reading block 0,
  // writing nothing, logits computed and ignored.
  int32_t* tokens = reinterpret_cast<int32_t*>(base + m.off_tokens);
  int32_t* positions = reinterpret_cast<int32_t*>(base + m.off_positions);
  int64_t* slots = reinterpret_cast<int64_t*>(base + m.off_slots);
  int32_t* qsl = reinterpret_cast<int32_t*>(base + m.off_qsl);
  int32_t* seq_lens = reinterpret_cast<int32_t*>(base + m.off_seq_lens);
  int32_t* logits_idx = reinterpret_cast<int32_t*>(base + m.off_logits_idx);
  if (m.vocab_start != 0) {
    // Vocabulary-parallel embedding: ids outside this rank's slice become
    // out-of-range rows, which the kernel writes as zeros.
    for (int t = 0; t < n; ++t) tokens[t] -= static_cast<int32_t>(m.vocab_start);
  }
  for (int64_t t = n; t < padded_tokens; ++t) {
    tokens[t] = 0;
    positions[t] = 0;
    slots[t] = -1;
  }
  for (int i = s; i < padded_seqs; ++i) {
    qsl[i + 1] = qsl[i] + 1;
    seq_lens[i] = 1;
    std::fill(tables + i * stride, tables + (i + 1) * stride, 0);
  }
  if (padded_seqs > s) {
    for (int i = 0; i < padded_seqs; ++i) logits_idx[i] = i;
  }
  // Only the used prefix of the block-table section is copied.
  size_t bytes = m.off_block_tables + static_cast<size_t>(padded_seqs) * stride * sizeof(int32_t);
  *tree = false;
  for (int i = 0; i < s && !b.tree_parents.empty() && !*tree; ++i) {
    for (int t = b.query_start_loc[i]; t < b.query_start_loc[i + 1]; ++t) {
      *tree |= b.tree_parents[t] != t - b.query_start_loc[i] - 1;
    }
  }
  if (*tree) {
    // Per chunk its trunk P, and per token past the trunk its ancestor
    // mask: bit j = chunk token P + j is the token or one of its ancestors.
    // Trunk tokens, and chunks that do not branch (P = q_len), are causal
    // (all ones).
    m.off_tree = (bytes + 7) & ~size_t{7};
    m.off_tree_prefix = m.off_tree + static_cast<size_t>(n) * sizeof(uint64_t);
    uint64_t* masks = reinterpret_cast<uint64_t*>(base + m.off_tree);
    int32_t* trunks = reinterpret_cast<int32_t*>(base + m.off_tree_prefix);
    for (int i = 0; i < s; ++i) {
      const int begin = b.query_start_loc[i], q_len = b.query_start_loc[i + 1] - begin;
      const int trunk = TreeTrunk(b.tree_parents.data() + begin, q_len);
      trunks[i] = trunk;
      for (int j = 0; j < q_len; ++j) {
        const int32_t parent = b.tree_parents[begin + j];
        masks[begin + j] = j < trunk ? ~uint64_t{0}
                                     : (parent < trunk ? uint64_t{0} : masks[begin + parent]) |
                                           (uint64_t{1} << (j - trunk));
      }
    }
    bytes = m.off_tree_prefix + static_cast<size_t>(s) * sizeof(int32_t);
  }
  return kcu::CopyToDevice(m.meta.data(), base, bytes, m.stream.get());
}

absl::Status CudaModelRunner::RunModel(int64_t T, int num_seqs, int64_t num_logits, bool decode,
                                       int max_seq_len, int max_query_len, bool tree) {
  Impl& m = *impl_;
  const model::ModelConfig& c = config_;
  kcu::CudaStream st = m.stream.get();
  const int64_t D = c.head_dim, H = c.hidden_size, Q = m.heads * D, K = m.kv_heads * D;
  const int64_t I = m.inter, QKV = Q + 2 * K, V = m.vocab;
  const int heads = static_cast<int>(m.heads);
  const int kv_heads = static_cast<int>(m.kv_heads);
  // Sum of the ranks' partial results, in place (no-op on one rank).
  auto all_reduce = [&](void* data, int64_t count, kcu::NcclGroup::DType dtype) {
    if (m.nccl == nullptr) return absl::OkStatus();
    if (options_.p2p != nullptr && dtype == kcu::NcclGroup::DType::kBf16 &&
        count * 2 <= kernels::kP2pAllReduceMaxBytes && count <= options_.p2p->max_count()) {
      return options_.p2p->AllReduceSumBf16(m.rank, static_cast<Bf16*>(data), count, st);
    }
    return m.nccl->AllReduceSum(m.rank, data, count, dtype, st);
  };
  const float eps = static_cast<float>(c.rms_norm_eps);
  Bf16* xb = m.xb.as<Bf16>();
  Bf16* delta = m.delta.as<Bf16>();
  float* residual = m.residual.as<float>();
  // delta (this rank's partial sums) summed over the ranks and added to the
  // residual stream, then xb = RMSNorm(residual) * w: one kernel with the
  // peer-to-peer all-reduce, else the all-reduce and FusedAddRmsNorm.
  auto p2p_add_norm = [&](const DeviceBuffer& norm_w) {
    return m.nccl != nullptr && options_.p2p != nullptr &&
           T * H * 2 <= kernels::kP2pAllReduceMaxBytes && T * H <= options_.p2p->max_count() &&
           kcu::P2pAllReduce::AddRmsNormSupports(delta, residual, H, norm_w.as<float>(), xb);
  };
  auto reduce_add_norm = [&](const DeviceBuffer& norm_w) -> absl::Status {
    const float* w = norm_w.as<float>();
    if (p2p_add_norm(norm_w)) {
      return options_.p2p->AllReduceAddRmsNorm(m.rank, delta, residual, T, H, w, eps, xb, st);
    }
    RETURN_IF_ERROR(all_reduce(delta, T * H, kcu::NcclGroup::DType::kBf16));
    return kcu::FusedAddRmsNorm(delta, residual, T, H, w, eps, xb, st);
  };
  const int64_t slots = num_kv_blocks_ * options_.block_size;
  const int64_t layer_elems = slots * K;
  auto f32 = [](const DeviceBuffer& b) { return b.size() == 0 ? nullptr : b.as<float>(); };

  Bf16* qkv = m.qkv.as<Bf16>();
  // The embedding. With the p2p all-reduce, each rank looks its vocabulary
  // slice up in bf16 (other ids: zeros) and the first layer's input norm is
  // the fused all-reduce + RMSNorm that sets the residual to the sum:
  // exactly one rank holds each id, so the residual gets the table's
  // values as the fp32 path gives them, in one p2p kernel instead of an
  // fp32 NCCL all-reduce and a norm. Otherwise fp32 rows, summed over the
  // ranks, then the norm.
  const bool p2p_embedding = !m.layers.empty() && p2p_add_norm(m.layers[0].input_norm);
  const int32_t* tokens = m.MetaPtr<int32_t>(m.off_tokens);
  if (p2p_embedding) {
    RETURN_IF_ERROR(kcu::EmbeddingBf16(m.embed.as<Bf16>(), V, H, tokens, T, delta, st));
  } else {
    RETURN_IF_ERROR(kcu::Embedding(m.embed.as<Bf16>(), V, H, tokens, T, residual, st));
    RETURN_IF_ERROR(all_reduce(residual, T * H, kcu::NcclGroup::DType::kF32));
  }
  // RoPE-ordered q/k rows (Impl::qkv_rope_order) and a step the GEMV takes:
  // the qkv GEMV rotates and writes the KV cache itself.
  const bool fuse_rope = m.qkv_rope_order && m.gemm->GemvTakes(T, H);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const Impl::Layer& l = m.layers[i];
    if (i == 0 && p2p_embedding) {
      RETURN_IF_ERROR(options_.p2p->AllReduceRmsNorm(m.rank, delta, residual, T, H,
                                                     l.input_norm.as<float>(), eps, xb, st));
    } else if (i == 0) {
      RETURN_IF_ERROR(kcu::RmsNorm(residual, T, H, l.input_norm.as<float>(), eps, xb, st));
    } else {
      RETURN_IF_ERROR(reduce_add_norm(l.input_norm));  // the previous layer's MLP output
    }
    Bf16* k_cache = m.k_cache.as<Bf16>() + i * layer_elems;
    Bf16* v_cache = m.v_cache.as<Bf16>() + i * layer_elems;
    if (fuse_rope) {
      // Steps of <= 8 tokens: RoPE and the K/V write in the qkv GEMV.
      kcu::GemvQkvRope rope;
      rope.head_dim = static_cast<int>(D);
      rope.q_rows = Q;
      rope.k_rows = K;
      rope.positions = m.MetaPtr<int32_t>(m.off_positions);
      rope.inv_freq = m.inv_freq.as<float>();
      rope.slots = m.MetaPtr<int64_t>(m.off_slots);
      rope.num_slots = slots;
      rope.k_cache = k_cache;
      rope.v_cache = v_cache;
      RETURN_IF_ERROR(m.gemm->QkvRope(xb, T, H, l.qkv_w.as<Bf16>(), f32(l.qkv_b), qkv, rope, st));
    } else {
      RETURN_IF_ERROR(
          m.gemm->GemmChained(xb, T, H, l.qkv_w.as<Bf16>(), QKV, f32(l.qkv_b), qkv, st));
    }
    // Decode steps the GEMV does not take: RoPE (after Qwen3's q/k norms,
    // whose rows are never RoPE-ordered) and the K/V write in the attention
    // kernel (kcu::DecodeRope).
    kcu::DecodeRope decode_rope;
    const bool rope_in_attention = decode && !fuse_rope && m.rope_in_attention;
    if (rope_in_attention) {
      decode_rope.positions = m.MetaPtr<int32_t>(m.off_positions);
      decode_rope.inv_freq = m.inv_freq.as<float>();
      decode_rope.rope_order = m.qkv_rope_order;
      decode_rope.k = qkv + Q;
      decode_rope.v = qkv + Q + K;
      decode_rope.kv_token_stride = QKV;
      decode_rope.slots = m.MetaPtr<int64_t>(m.off_slots);
      decode_rope.num_slots = slots;
      decode_rope.k_cache = k_cache;
      decode_rope.v_cache = v_cache;
      decode_rope.q_norm = f32(l.q_norm);
      decode_rope.k_norm = f32(l.k_norm);
      decode_rope.norm_eps = eps;
    } else if (!fuse_rope) {
      // Prefill: RoPE (and Qwen3's q/k norm) in place, and K/V into the
      // paged cache, in one kernel (also decode, for comparison, after
      // SetRopeInAttention(false)).
      kcu::RopeKvWrite kv_write;
      kv_write.v = qkv + Q + K;
      kv_write.v_token_stride = QKV;
      kv_write.slots = m.MetaPtr<int64_t>(m.off_slots);
      kv_write.k_cache = k_cache;
      kv_write.v_cache = v_cache;
      kv_write.num_slots = slots;
      RETURN_IF_ERROR(kcu::Rope(qkv, QKV, heads, qkv + Q, QKV, kv_heads, static_cast<int>(D),
                                m.MetaPtr<int32_t>(m.off_positions), T, m.inv_freq.as<float>(),
                                f32(l.q_norm), f32(l.k_norm), eps, st, &kv_write,
                                m.qkv_rope_order));
    }
    kcu::PagedAttentionParams p;
    p.rope = rope_in_attention ? &decode_rope : nullptr;
    p.q = qkv;
    p.q_token_stride = QKV;
    p.k_cache = k_cache;
    p.v_cache = v_cache;
    p.block_tables = m.MetaPtr<int32_t>(m.off_block_tables);
    p.block_table_stride = m.table_stride;
    p.seq_lens = m.MetaPtr<int32_t>(m.off_seq_lens);
    p.query_start_loc = m.MetaPtr<int32_t>(m.off_qsl);
    p.num_seqs = num_seqs;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = static_cast<int>(D);
    p.block_size = options_.block_size;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.max_seq_len = max_seq_len;
    p.max_query_len = max_query_len;
    p.out = m.attn.as<Bf16>();
    p.out_token_stride = Q;
    p.workspace = m.attn_workspace.data();
    p.workspace_bytes = m.attn_workspace.size();
    // Token trees: only the portable prefill kernel reads the masks
    // (PrefillAttentionSm90Supports is false with them); a decode step has
    // no branching chunk.
    p.tree_ancestors = tree && !decode ? m.MetaPtr<uint64_t>(m.off_tree) : nullptr;
    p.tree_prefix = tree && !decode ? m.MetaPtr<int32_t>(m.off_tree_prefix) : nullptr;
    RETURN_IF_ERROR(decode ? kcu::PagedAttentionDecode(p, st)
                    : options_.prefill_attention_backend == kernels::kCudaSm90aBackend &&
                            kcu::PrefillAttentionSm90Supports(p)
                        ? kcu::PrefillAttentionSm90(p, st)
                        : kcu::PagedAttentionPrefill(p, st));
    RETURN_IF_ERROR(
        m.gemm->GemmChained(m.attn.as<Bf16>(), T, Q, l.o_w.as<Bf16>(), H, f32(l.o_b), delta, st));
    RETURN_IF_ERROR(reduce_add_norm(l.post_norm));
    if (m.gate_up_interleaved && m.gemm->StagedTakes(T, 2 * I, H)) {
      // SiLU·mul in the staged GEMV's epilogue: one kernel less.
      RETURN_IF_ERROR(kcu::GemvStagedGateUpSiluBf16(xb, T, H, l.gate_up_w.as<Bf16>(), I,
                                                    f32(l.gate_up_b), m.act.as<Bf16>(), st));
    } else {
      RETURN_IF_ERROR(m.gemm->GemmChained(xb, T, H, l.gate_up_w.as<Bf16>(), 2 * I, f32(l.gate_up_b),
                                          m.gate_up.as<Bf16>(), st));
      RETURN_IF_ERROR(
          kcu::SiluMul(m.gate_up.as<Bf16>(), T, I, m.act.as<Bf16>(), st, m.gate_up_interleaved));
    }
    RETURN_IF_ERROR(
        m.gemm->Gemm(m.act.as<Bf16>(), T, I, l.down_w.as<Bf16>(), H, f32(l.down_b), delta, st));
  }
  RETURN_IF_ERROR(reduce_add_norm(m.final_norm));
  if (num_logits == 0) return absl::OkStatus();
  RETURN_IF_ERROR(kcu::GatherRows(xb, T, H, m.MetaPtr<int32_t>(m.off_logits_idx), num_logits,
                                  m.rows.as<Bf16>(), st));
  return m.gemm->Gemm(m.rows.as<Bf16>(), num_logits, H, m.lm_head, V, nullptr, m.logits.as<float>(),
                      st);
}

absl::Status CudaModelRunner::Execute(const ForwardBatch& batch, int64_t* num_logits) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  Impl& m = *impl_;
  RETURN_IF_ERROR(kcu::SetDevice(m.ordinal));
  const int s = batch.num_seqs();
  const int64_t n = batch.num_tokens();
  int max_seq_len = 0, max_query_len = 0;
  for (int i = 0; i < s; ++i) {
    max_seq_len = std::max(max_seq_len, batch.seq_lens[i]);
    max_query_len =
        std::max(max_query_len, batch.query_start_loc[i + 1] - batch.query_start_loc[i]);
  }
  const bool decode = max_query_len == 1;
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  if (r > m.max_logits_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(r, " logits rows exceed the runner's ", m.max_logits_rows));
  }
  *num_logits = r;

  // Graph path: a decode step whose every sequence wants its logits.
  const bool graph_ok = decode && options_.cuda_graphs && s <= options_.max_graph_batch && r == s;
  const int bucket_seqs =
      graph_ok ? static_cast<int>(std::min<int64_t>(RoundUpPow2(s), options_.max_num_seqs)) : s;
  const int ctx_bucket =
      graph_ok
          ? static_cast<int>(std::min<int64_t>(std::max<int64_t>(256, RoundUpPow2(max_seq_len)),
                                               config_.max_position_embeddings))
          : max_seq_len;
  const int ws_seqs = graph_ok ? bucket_seqs : s;
  const int ws_ctx = graph_ok ? ctx_bucket : max_seq_len;
  if (decode) {
    const size_t need = kcu::PagedAttentionDecodeWorkspaceBytes(
        ws_seqs, static_cast<int>(m.heads), static_cast<int>(config_.head_dim), ws_ctx);
    if (need > m.attn_workspace.size()) {
      // Captured graphs hold the old pointer.
      RETURN_IF_ERROR(kcu::Synchronize(m.stream.get()));
      graphs_.clear();
      m.attn_workspace = DeviceBuffer();
      absl::StatusOr<DeviceBuffer> ws = Alloc(need, "attention workspace");
      if (!ws.ok()) return ws.status();
      m.attn_workspace = std::move(*ws);
    }
  }
  bool tree = false;
  RETURN_IF_ERROR(Stage(batch, graph_ok ? bucket_seqs : n, graph_ok ? bucket_seqs : s,
                        graph_ok ? ctx_bucket : max_seq_len, &tree));
  // A branching chunk has at least two tokens, so a tree step is never a
  // decode step and never reaches a graph.
  if (tree && decode) return absl::InternalError("a branching chunk in a decode step");
  if (!graph_ok) return RunModel(n, s, r, decode, max_seq_len, max_query_len, tree);

  *num_logits = s;  // padded rows follow; callers read the first s
  const std::pair<int, int> key{bucket_seqs, ctx_bucket};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (options_.gemm_autotune && tuned_buckets_.insert(bucket_seqs).second) {
      // Tunes the step's cuBLASLt shapes, which capture cannot time. The
      // step is idempotent: the graph recomputes the same values. The
      // shapes depend on the batch bucket only, so one run per bucket.
      m.gemm->SetAutotune(bucket_seqs);
      ++autotune_runs_;
      absl::Status tuned = RunModel(bucket_seqs, bucket_seqs, bucket_seqs, true, ctx_bucket, 1);
      m.gemm->SetAutotune(0);
      if (!tuned.ok()) {
        tuned_buckets_.erase(bucket_seqs);
        return tuned;
      }
    }
    auto g = std::make_unique<Graph>();
    RETURN_IF_ERROR(g->graph.BeginCapture(m.stream.get()));
    absl::Status run = RunModel(bucket_seqs, bucket_seqs, bucket_seqs, true, ctx_bucket, 1);
    absl::Status end = g->graph.EndCapture();
    if (!run.ok()) return run;
    if (!end.ok()) return end;
    it = graphs_.emplace(key, std::move(g)).first;
  }
  last_graph_ = key;
  return it->second->graph.Launch(m.stream.get());
}

absl::StatusOr<double> CudaModelRunner::ReplayLastDecodeGraphMs(int replays, int64_t argmax_rows) {
  Impl& m = *impl_;
  auto it = graphs_.find(last_graph_);
  if (it == graphs_.end()) {
    return absl::FailedPreconditionError("no decode step has run as a CUDA graph yet");
  }
  if (replays < 1 || argmax_rows < 0 || argmax_rows > m.max_logits_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReplayLastDecodeGraphMs: replays ", replays, ", argmax rows ", argmax_rows));
  }
  kcu::CudaStream st = m.stream.get();
  absl::StatusOr<kcu::Event> start = kcu::Event::Create();
  if (!start.ok()) return start.status();
  absl::StatusOr<kcu::Event> stop = kcu::Event::Create();
  if (!stop.ok()) return stop.status();
  RETURN_IF_ERROR(kcu::Synchronize(st));
  RETURN_IF_ERROR(start->Record(st));
  for (int i = 0; i < replays; ++i) {
    RETURN_IF_ERROR(it->second->graph.Launch(st));
    if (argmax_rows > 0) {
      RETURN_IF_ERROR(
          kcu::ArgmaxRows(m.logits.as<float>(), argmax_rows, m.vocab, m.argmax.as<int32_t>(), st));
    }
  }
  RETURN_IF_ERROR(stop->Record(st));
  RETURN_IF_ERROR(stop->Synchronize());
  absl::StatusOr<float> ms = kcu::Event::ElapsedMs(*start, *stop);
  if (!ms.ok()) return ms.status();
  return static_cast<double>(*ms) / replays;
}

absl::Status CudaModelRunner::SetUseGemv(bool use, int64_t max_weight_elems) {
  RETURN_IF_ERROR(kcu::Synchronize(impl_->stream.get()));
  impl_->gemm->SetUseGemv(use);
  impl_->gemm->SetGemvMaxWeightElems(max_weight_elems > 0 ? max_weight_elems
                                                          : kcu::kGemvDefaultMaxWeightElems);
  graphs_.clear();
  last_graph_ = {-1, -1};
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Synchronize() {
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::SetRopeInAttention(bool in_attention) {
  RETURN_IF_ERROR(kcu::Synchronize(impl_->stream.get()));
  impl_->rope_in_attention = in_attention;
  graphs_.clear();
  last_graph_ = {-1, -1};
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  logits->resize(static_cast<size_t>(r * impl_->vocab));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::CopyToHost(logits->data(), impl_->logits.data(),
                                    logits->size() * sizeof(float), impl_->stream.get()));
  }
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::ForwardGreedy(const ForwardBatch& batch,
                                            std::vector<int32_t>* tokens) {
  if (impl_->nccl != nullptr) {
    return absl::FailedPreconditionError("ForwardGreedy needs the whole vocabulary on one rank");
  }
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  tokens->resize(static_cast<size_t>(r));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::ArgmaxRows(impl_->logits.as<float>(), r, config_.vocab_size,
                                    impl_->argmax.as<int32_t>(), impl_->stream.get()));
    RETURN_IF_ERROR(kcu::CopyToHost(tokens->data(), impl_->argmax.data(), r * sizeof(int32_t),
                                    impl_->stream.get()));
  }
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::ForwardTopOne(const ForwardBatch& batch, std::vector<int32_t>* ids,
                                            std::vector<float>* values) {
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  Impl& m = *impl_;
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  ids->resize(static_cast<size_t>(r));
  values->resize(static_cast<size_t>(r));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::TopOneRows(
        m.logits.as<float>(), r, m.vocab, m.vocab_start, m.argmax.as<int32_t>(),
        m.top_values.as<float>(), m.top_workspace.data(), m.top_workspace.size(), m.stream.get()));
    RETURN_IF_ERROR(
        kcu::CopyToHost(ids->data(), m.argmax.data(), r * sizeof(int32_t), m.stream.get()));
    RETURN_IF_ERROR(
        kcu::CopyToHost(values->data(), m.top_values.data(), r * sizeof(float), m.stream.get()));
  }
  return kcu::Synchronize(m.stream.get());
}

absl::Status CudaModelRunner::CopyKvSlots(absl::Span<const int64_t> from,
                                          absl::Span<const int64_t> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvSlots: ", from.size(), " sources but ", to.size(), " destinations"));
  }
  const int64_t num_slots = num_kv_blocks_ * options_.block_size;
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] < 0 || from[i] >= num_slots || to[i] < 0 || to[i] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKvSlots: slot pair ", i, " (", from[i],
                                                     " -> ", to[i], ") outside the cache of ",
                                                     num_slots, " slots"));
    }
  }
  if (from.empty()) return absl::OkStatus();
  Impl& m = *impl_;
  RETURN_IF_ERROR(kcu::SetDevice(m.ordinal));
  kcu::CudaStream st = m.stream.get();
  const size_t pairs = from.size();
  const size_t bytes = 2 * pairs * sizeof(int64_t);
  if (bytes > m.kv_copy_pairs.size()) {
    RETURN_IF_ERROR(kcu::Synchronize(st));  // an earlier copy may still read the old buffer
    m.kv_copy_pairs = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> buf = Alloc(std::max<size_t>(bytes, 1024), "KV slot copy pairs");
    if (!buf.ok()) return buf.status();
    m.kv_copy_pairs = std::move(*buf);
  }
  // One staging copy: the sources, then the destinations.
  m.host_kv_copy_pairs.assign(from.begin(), from.end());
  m.host_kv_copy_pairs.insert(m.host_kv_copy_pairs.end(), to.begin(), to.end());
  RETURN_IF_ERROR(
      kcu::CopyToDevice(m.kv_copy_pairs.data(), m.host_kv_copy_pairs.data(), bytes, st));
  const int64_t* dev = m.kv_copy_pairs.as<int64_t>();
  const int64_t row = m.kv_heads * config_.head_dim;
  return kcu::CopyKvCacheSlots(m.k_cache.as<Bf16>(), m.v_cache.as<Bf16>(),
                               config_.num_hidden_layers, num_slots * row, row, dev, dev + pairs,
                               static_cast<int64_t>(pairs), st);
}

bool CudaModelRunner::SupportsDeviceSampling() const { return impl_->nccl == nullptr; }

absl::Status CudaModelRunner::ForwardSample(const ForwardBatch& batch,
                                            absl::Span<const DeviceSamplingRow> rows,
                                            std::vector<int32_t>* tokens) {
  if (!SupportsDeviceSampling()) {
    return absl::FailedPreconditionError("sampling on the device needs the whole vocabulary");
  }
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  if (static_cast<int64_t>(rows.size()) != r) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows.size(), " sampling rows for ", r, " logits rows"));
  }
  int64_t computed = 0;
  RETURN_IF_ERROR(Execute(batch, &computed));
  return SampleOnDevice(impl_->logits.as<float>(), r, impl_->vocab, rows, tokens);
}

absl::Status CudaModelRunner::SampleOnDevice(const float* logits, int64_t r, int64_t vocab,
                                             absl::Span<const DeviceSamplingRow> rows,
                                             std::vector<int32_t>* tokens) {
  Impl& m = *impl_;
  tokens->resize(static_cast<size_t>(r));
  if (r > 0) {
    std::vector<kcu::RowSamplingParams> params(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) {
      params[i].temperature = rows[i].temperature;
      params[i].top_k = rows[i].top_k;
      params[i].top_p = rows[i].top_p;
      params[i].min_p = rows[i].min_p;
      params[i].seed = rows[i].seed;
      params[i].position = rows[i].position;
    }
    kcu::CudaStream st = m.stream.get();
    RETURN_IF_ERROR(kcu::CopyToDevice(m.sampling_params.data(), params.data(),
                                      params.size() * sizeof(kcu::RowSamplingParams), st));
    // The sampler's weights: allocated on the first sampled step, grown to
    // the largest number of rows seen (greedy-only serving never needs it).
    RETURN_IF_ERROR(GrowScratch(&m.sample_workspace, kcu::SampleRowsWorkspaceBytes(r, vocab),
                                "sampling workspace", st));
    RETURN_IF_ERROR(kcu::SampleRows(
        logits, r, vocab, m.sampling_params.as<kcu::RowSamplingParams>(), m.argmax.as<int32_t>(),
        m.sample_workspace.data(), m.sample_workspace.size(), st));
    RETURN_IF_ERROR(kcu::CopyToHost(tokens->data(), m.argmax.data(), r * sizeof(int32_t), st));
  }
  return kcu::Synchronize(m.stream.get());
}

absl::Status CudaModelRunner::ForwardToDevice(const ForwardBatch& batch) {
  int64_t computed = 0;
  RETURN_IF_ERROR(Execute(batch, &computed));
  return impl_->logits_ready.Record(impl_->stream.get());
}

CudaModelRunner::LogitsSlice CudaModelRunner::device_logits() const {
  return {impl_->logits.as<float>(), impl_->vocab_start, impl_->vocab, impl_->ordinal,
          &impl_->logits_ready};
}

absl::Status CudaModelRunner::SampleSlices(absl::Span<const LogitsSlice> slices, int64_t r,
                                           absl::Span<const DeviceSamplingRow> rows,
                                           std::vector<int32_t>* tokens) {
  const int64_t vocab = config_.vocab_size;
  if (static_cast<int64_t>(rows.size()) != r || r < 0 || r > impl_->max_logits_rows) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " sampling rows for ", r,
                                                   " logits rows (at most ", impl_->max_logits_rows,
                                                   ")"));
  }
  int64_t next = 0;  // the slices must tile [0, vocab) in order
  for (const LogitsSlice& sl : slices) {
    if (sl.data == nullptr || sl.start != next || sl.cols <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SampleSlices: slice at column ", sl.start, " of ", sl.cols,
                       " does not continue the vocabulary at ", next));
    }
    next += sl.cols;
  }
  if (next != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleSlices: the slices cover ", next, " of ", vocab, " columns"));
  }
  Impl& m = *impl_;
  RETURN_IF_ERROR(kcu::SetDevice(m.ordinal));
  // One slice on this device (a one-rank group) is already the whole row
  // block: sample it where it is.
  if (slices.size() == 1 && slices[0].ordinal == m.ordinal) {
    return SampleOnDevice(slices[0].data, r, vocab, rows, tokens);
  }
  kcu::CudaStream st = m.stream.get();
  RETURN_IF_ERROR(GrowScratch(&m.gathered_logits, static_cast<size_t>(r * vocab) * sizeof(float),
                              "gathered logits", st));
  float* full = m.gathered_logits.as<float>();
  for (const LogitsSlice& sl : slices) {
    // A peer's rows are copied once its step has written them; this
    // device's own are ordered by the stream already.
    if (r > 0 && sl.ready != nullptr && sl.ordinal != m.ordinal) {
      RETURN_IF_ERROR(sl.ready->WaitOn(st));
    }
    RETURN_IF_ERROR(kcu::CopyRowsBetweenDevices(
        full + sl.start, m.ordinal, vocab * sizeof(float), sl.data, sl.ordinal,
        sl.cols * sizeof(float), sl.cols * sizeof(float), static_cast<size_t>(r), st));
  }
  return SampleOnDevice(full, r, vocab, rows, tokens);
}

}  // namespace tessera::runner
