#include "worker/runner/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/top_one.h"
#include "kernels/cuda_backend.h"
#include "worker/runner/cuda/cuda_kv_cache.h"
#include "worker/runner/cuda/rank_reduce.h"
#include "worker/runner/cuda/staged_batch.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;
using kcu::DeviceBuffer;

// Smallest power of two >= n (n >= 1).
int64_t RoundUpPow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Grows `buffer` to at least `bytes`: scratch that only some steps need
// (sampling), allocated when the first such step comes. The old buffer goes
// only once `stream` has finished with it.
absl::Status GrowScratch(DeviceBuffer* buffer, size_t bytes, std::string_view what,
                         kcu::CudaStream stream) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  RETURN_IF_ERROR(kcu::Synchronize(stream));
  *buffer = DeviceBuffer();
  absl::StatusOr<DeviceBuffer> b = AllocateDevice(bytes, what);
  if (!b.ok()) return b.status();
  *buffer = std::move(*b);
  return absl::OkStatus();
}

}  // namespace

struct CudaModelRunner::Graph {
  kcu::CudaGraph graph;
};

struct CudaModelRunner::Impl {
  int ordinal = 0;
  parallel::ShardPlan plan;  // this rank's part (the whole model without a shard)
  RankReduce reduce;
  kcu::Stream stream;
  // Recorded after the logits of a ForwardToDevice step (LogitsSlice::ready).
  kcu::Event logits_ready;
  std::unique_ptr<kcu::GemmContext> gemm;
  CudaWeights weights;
  std::unique_ptr<CudaKvCache> kv;
  std::unique_ptr<StagedBatch> batch;
  CudaActivations act;
  // Device sampling and argmax.
  DeviceBuffer argmax, top_values, top_workspace;
  DeviceBuffer sampling_params;   // kcu::RowSamplingParams per logits row
  DeviceBuffer sample_workspace;  // kcu::SampleRows' weights (first sampled step)
  // Every rank's logits slice side by side, [rows, vocab] (SampleSlices;
  // the first sampled step of a tensor-parallel group, grown as needed).
  DeviceBuffer gathered_logits;
  int64_t max_logits_rows = 0;

  int64_t heads() const { return plan.q_heads.size; }
  int64_t kv_heads() const { return plan.kv_heads.size; }
  int64_t vocab() const { return plan.vocab.size; }
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
  Impl& m = *impl_;
  m.ordinal = device.ordinal;
  m.plan = options_.shard ? *options_.shard : parallel::FullPlan(config_);
  if (m.plan.sharded() && options_.nccl == nullptr) {
    return absl::InvalidArgumentError("a sharded CUDA runner needs an NCCL group");
  }
  if (m.plan.sharded()) m.reduce = RankReduce(m.plan.rank, options_.nccl, options_.p2p);
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
  m.stream = std::move(*stream);
  absl::StatusOr<kcu::Event> ready = kcu::Event::Create(/*timing=*/false);
  if (!ready.ok()) return ready.status();
  m.logits_ready = std::move(*ready);
  absl::StatusOr<std::unique_ptr<kcu::GemmContext>> gemm = kcu::GemmContext::Create();
  if (!gemm.ok()) return gemm.status();
  m.gemm = std::move(*gemm);
  m.gemm->SetAutotuneCandidates(options_.gemm_autotune_candidates);
  if (options_.gemm_tuning != nullptr) m.gemm->ShareTuning(options_.gemm_tuning);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const model::LoadedModel* model, const kernels::DeviceDescription& device,
    CudaRunnerOptions options) {
  return Create(
      model->config,
      [model](const model::ModelConfig&, const parallel::ShardPlan& plan) {
        return UploadWeights(*model, plan);
      },
      device, std::move(options));
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const model::ModelConfig& config, const CudaWeightsFactory& weights,
    const kernels::DeviceDescription& device, CudaRunnerOptions options) {
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(config, std::move(options)));
  RETURN_IF_ERROR(r->Init(device));
  Impl& m = *r->impl_;
  absl::StatusOr<CudaWeights> w = weights(r->config_, m.plan);
  if (!w.ok()) return w.status();
  if (static_cast<int64_t>(w->layers.size()) != r->config_.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights for ", w->layers.size(),
                                                   " layers, the config has ",
                                                   r->config_.num_hidden_layers));
  }
  m.weights = std::move(*w);
  r->weight_bytes_ = m.weights.bytes;
  RETURN_IF_ERROR(r->AllocateCacheAndWorkspace());
  return r;
}

absl::Status CudaModelRunner::AllocateCacheAndWorkspace() {
  Impl& m = *impl_;
  const model::ModelConfig& c = config_;
  const int64_t T = options_.max_num_tokens, S = options_.max_num_seqs;
  const int64_t H = c.hidden_size, Q = m.heads() * c.head_dim, K = m.kv_heads() * c.head_dim,
                I = m.plan.intermediate.size, V = m.vocab();
  // Rows that want logits: one per sequence, more with speculative tokens.
  m.max_logits_rows = std::min<int64_t>(T, std::max<int64_t>(256, 8 * S));
  absl::StatusOr<StagedBatch> batch = StagedBatch::Create(
      {T, static_cast<int>(S), m.max_logits_rows,
       (c.max_position_embeddings + options_.block_size - 1) / options_.block_size});
  if (!batch.ok()) return batch.status();
  m.batch = std::make_unique<StagedBatch>(std::move(*batch));

  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
    const char* what;
  };
  // Decode workspace for the largest graph bucket at a moderate context;
  // Execute() grows it (dropping captured graphs) when a step needs more.
  const size_t attn_ws = kcu::PagedAttentionDecodeWorkspaceBytes(
      static_cast<int>(S), static_cast<int>(m.heads()), static_cast<int>(c.head_dim),
      static_cast<int>(std::min<int64_t>(c.max_position_embeddings, 8192)));
  CudaActivations& a = m.act;
  const Want wants[] = {
      {&a.residual, T * H * sizeof(float), "residual"},
      {&a.xb, T * H * sizeof(Bf16), "activations"},
      {&a.qkv, T * (Q + 2 * K) * sizeof(Bf16), "qkv"},
      {&a.attn, T * Q * sizeof(Bf16), "attention output"},
      {&a.delta, T * H * sizeof(Bf16), "activations"},
      {&a.gate_up, T * 2 * I * sizeof(Bf16), "gate_up"},
      {&a.act, T * I * sizeof(Bf16), "mlp activations"},
      {&a.rows, m.max_logits_rows * H * sizeof(Bf16), "logits rows"},
      {&a.logits, m.max_logits_rows * V * sizeof(float), "logits"},
      {&m.argmax, m.max_logits_rows * sizeof(int32_t), "argmax"},
      {&m.top_values, m.max_logits_rows * sizeof(float), "argmax values"},
      {&m.top_workspace, kcu::TopOneWorkspaceBytes(m.max_logits_rows), "argmax workspace"},
      {&m.sampling_params, m.max_logits_rows * sizeof(kcu::RowSamplingParams), "sampling params"},
      {&a.attn_workspace, std::max<size_t>(attn_ws, 256), "attention workspace"},
  };
  for (const Want& want : wants) {
    absl::StatusOr<DeviceBuffer> b = AllocateDevice(want.bytes, want.what);
    if (!b.ok()) return b.status();
    *want.buf = std::move(*b);
  }
  absl::StatusOr<CudaKvCache> kv =
      CudaKvCache::Create({c.num_hidden_layers, options_.block_size, K}, options_.num_kv_blocks,
                          options_.gpu_memory_fraction, m.stream.get());
  if (!kv.ok()) {
    return absl::Status(kv.status().code(), absl::StrCat(kv.status().message(), " (after ",
                                                         weight_bytes_ >> 20, " MiB of weights)"));
  }
  m.kv = std::make_unique<CudaKvCache>(std::move(*kv));
  num_kv_blocks_ = m.kv->num_blocks();
  LogInfo("cuda runner ready", {{"weights_mib", weight_bytes_ >> 20},
                                {"kv_blocks", num_kv_blocks_},
                                {"kv_cache_mib", m.kv->bytes() >> 20},
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

StepPlan CudaModelRunner::PlanStep(int64_t tokens, int seqs, int64_t logits_rows, bool decode,
                                   int max_seq_len, int max_query_len, bool tree) const {
  const Impl& m = *impl_;
  const int64_t H = config_.hidden_size, I = m.plan.intermediate.size;
  StepPlan p;
  p.tokens = tokens;
  p.seqs = seqs;
  p.logits_rows = logits_rows;
  p.decode = decode;
  p.max_seq_len = max_seq_len;
  p.max_query_len = max_query_len;
  p.tree = tree;
  p.rope_in_qkv_gemv = m.weights.qkv_rope_order && m.gemm->GemvTakes(tokens, H);
  p.rope_in_attention = decode && !p.rope_in_qkv_gemv;
  p.prefill_sm90 = options_.prefill_attention_backend == kernels::kCudaSm90aBackend;
  p.p2p_embedding =
      !m.weights.layers.empty() &&
      m.reduce.FusesNorm(m.act.delta.as<Bf16>(), m.act.residual.as<float>(), tokens, H,
                         m.weights.layers[0].input_norm.as<float>(), m.act.xb.as<Bf16>());
  p.gate_up_silu_in_gemv = m.weights.gate_up_interleaved && m.gemm->StagedTakes(tokens, 2 * I, H);
  return p;
}

absl::Status CudaModelRunner::RunModel(const StepPlan& plan) {
  Impl& m = *impl_;
  ForwardContext c;
  c.config = &config_;
  c.weights = &m.weights;
  c.batch = m.batch.get();
  c.kv = m.kv.get();
  c.act = &m.act;
  c.gemm = m.gemm.get();
  c.reduce = &m.reduce;
  c.stream = m.stream.get();
  c.heads = m.heads();
  c.kv_heads = m.kv_heads();
  c.inter = m.plan.intermediate.size;
  c.vocab = m.vocab();
  c.block_size = options_.block_size;

  RETURN_IF_ERROR(Embed(c, plan));
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const CudaLayerWeights& layer = m.weights.layers[i];
    if (i > 0) RETURN_IF_ERROR(AddAndNorm(c, plan, layer.input_norm));
    RETURN_IF_ERROR(AttentionBlock(c, plan, i));
    RETURN_IF_ERROR(AddAndNorm(c, plan, layer.post_norm));
    RETURN_IF_ERROR(MlpBlock(c, plan, i));
  }
  RETURN_IF_ERROR(AddAndNorm(c, plan, m.weights.final_norm));
  return LmHead(c, plan);
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
        ws_seqs, static_cast<int>(m.heads()), static_cast<int>(config_.head_dim), ws_ctx);
    if (need > m.act.attn_workspace.size()) {
      // Captured graphs hold the old pointer.
      RETURN_IF_ERROR(kcu::Synchronize(m.stream.get()));
      graphs_.clear();
      m.act.attn_workspace = DeviceBuffer();
      absl::StatusOr<DeviceBuffer> ws = AllocateDevice(need, "attention workspace");
      if (!ws.ok()) return ws.status();
      m.act.attn_workspace = std::move(*ws);
    }
  }
  const int64_t vocab_start = m.plan.vocab.start;
  absl::StatusOr<bool> tree = m.batch->Stage(
      batch, graph_ok ? bucket_seqs : n, graph_ok ? bucket_seqs : s,
      graph_ok ? ctx_bucket : max_seq_len, options_.block_size, vocab_start, m.stream.get());
  if (!tree.ok()) return tree.status();
  // A branching chunk has at least two tokens, so a tree step is never a
  // decode step and never reaches a graph.
  if (*tree && decode) return absl::InternalError("a branching chunk in a decode step");
  if (!graph_ok) {
    return RunModel(PlanStep(n, s, r, decode, max_seq_len, max_query_len, *tree));
  }

  *num_logits = s;  // padded rows follow; callers read the first s
  const std::pair<int, int> key{bucket_seqs, ctx_bucket};
  const StepPlan graph_plan =
      PlanStep(bucket_seqs, bucket_seqs, bucket_seqs, true, ctx_bucket, 1, /*tree=*/false);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (options_.gemm_autotune && tuned_buckets_.insert(bucket_seqs).second) {
      // Tunes the step's cuBLASLt shapes, which capture cannot time. The
      // step is idempotent: the graph recomputes the same values. The
      // shapes depend on the batch bucket only, so one run per bucket.
      m.gemm->SetAutotune(bucket_seqs);
      ++autotune_runs_;
      absl::Status tuned = RunModel(graph_plan);
      m.gemm->SetAutotune(0);
      if (!tuned.ok()) {
        tuned_buckets_.erase(bucket_seqs);
        return tuned;
      }
    }
    auto g = std::make_unique<Graph>();
    RETURN_IF_ERROR(g->graph.BeginCapture(m.stream.get()));
    absl::Status run = RunModel(graph_plan);
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
      RETURN_IF_ERROR(kcu::ArgmaxRows(m.act.logits.as<float>(), argmax_rows, m.vocab(),
                                      m.argmax.as<int32_t>(), st));
    }
  }
  RETURN_IF_ERROR(stop->Record(st));
  RETURN_IF_ERROR(stop->Synchronize());
  absl::StatusOr<float> ms = kcu::Event::ElapsedMs(*start, *stop);
  if (!ms.ok()) return ms.status();
  return static_cast<double>(*ms) / replays;
}

absl::Status CudaModelRunner::Synchronize() {
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  logits->resize(static_cast<size_t>(r * impl_->vocab()));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::CopyToHost(logits->data(), impl_->act.logits.data(),
                                    logits->size() * sizeof(float), impl_->stream.get()));
  }
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::ForwardGreedy(const ForwardBatch& batch,
                                            std::vector<int32_t>* tokens) {
  if (impl_->reduce.sharded()) {
    return absl::FailedPreconditionError("ForwardGreedy needs the whole vocabulary on one rank");
  }
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  tokens->resize(static_cast<size_t>(r));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::ArgmaxRows(impl_->act.logits.as<float>(), r, config_.vocab_size,
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
        m.act.logits.as<float>(), r, m.vocab(), m.plan.vocab.start, m.argmax.as<int32_t>(),
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
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  return impl_->kv->CopySlots(from, to, impl_->stream.get());
}

bool CudaModelRunner::SupportsDeviceSampling() const { return !impl_->reduce.sharded(); }

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
  return SampleOnDevice(impl_->act.logits.as<float>(), r, impl_->vocab(), rows, tokens);
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
  return {impl_->act.logits.as<float>(), impl_->plan.vocab.start, impl_->vocab(), impl_->ordinal,
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
