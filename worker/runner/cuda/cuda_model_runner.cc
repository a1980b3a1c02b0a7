#include "worker/runner/cuda/cuda_model_runner.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/pinned_buffer.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda_backend.h"
#include "worker/runner/cuda/cuda_kv_cache.h"
#include "worker/runner/cuda/rank_reduce.h"
#include "worker/runner/cuda/staged_batch.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;
using kcu::DeviceBuffer;

// The registry's prefill attention choice must run on `device` (checked on
// the current device, before any weights load).
absl::Status CheckPrefillBackend(const std::string& backend,
                                 const kernels::DeviceDescription& device) {
  if (backend == kernels::kCudaSm90aBackend) {
    std::string why;
    if (!kcu::PrefillAttentionSm90Available(&why)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prefill attention backend ", backend, " cannot run on ", device.Summary(), ": ", why));
    }
    return absl::OkStatus();
  }
  if (backend != kernels::kCudaBackend) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown prefill attention backend '", backend, "' (cuda or cuda-sm90a)"));
  }
  return absl::OkStatus();
}

}  // namespace

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
  int64_t max_logits_rows = 0;

  // Asynchronous steps (SubmitSample): a ring of the two that may be in
  // flight, oldest first. A step's draws land in its pinned `tokens` once
  // `done` has fired.
  struct SubmittedStep {
    int64_t rows = 0;
    kcu::PinnedBuffer tokens;
    kcu::Event done;
  };
  std::array<SubmittedStep, 2> submitted;
  int oldest = 0;
  int in_flight = 0;
  // Rows the sampler's device ids hold for the next step's PreviousStepToken
  // entries: the last SubmitSample's; -1 when another step has run since
  // (or that submission failed part-way).
  int64_t previous_rows = -1;

  int64_t heads() const { return plan.q_heads.size; }
  int64_t kv_heads() const { return plan.kv_heads.size; }
  int64_t vocab() const { return plan.vocab.size; }
};

CudaModelRunner::CudaModelRunner(model::ModelConfig config, CudaRunnerOptions options)
    : config_(std::move(config)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

CudaModelRunner::~CudaModelRunner() {
  if (impl_) {
    (void)kcu::SetDevice(impl_->ordinal);
    // Steps still queued write into pinned buffers about to be freed.
    if (impl_->stream.get() != nullptr) (void)kcu::Synchronize(impl_->stream.get());
  }
  graphs_.Clear();
}

absl::Status CudaModelRunner::Init(const kernels::DeviceDescription& device) {
  if (device.kind != kernels::DeviceKind::kCuda || !device.gpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA runner needs a CUDA device; got ", device.Summary()));
  }
  if (options_.block_size < 1 || options_.max_num_tokens < 1 || options_.max_num_seqs < 1) {
    return absl::InvalidArgumentError("block_size, max_num_tokens and max_num_seqs must be >= 1");
  }
  if (options_.routing_observer != nullptr && options_.cuda_graphs) {
    return absl::InvalidArgumentError("routing_observer needs cuda_graphs = false");
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
  RETURN_IF_ERROR(CheckPrefillBackend(options_.prefill_attention_backend, device));
  ASSIGN_OR_RETURN(m.stream, kcu::Stream::Create());
  ASSIGN_OR_RETURN(m.logits_ready, kcu::Event::Create(/*timing=*/false));
  ASSIGN_OR_RETURN(m.gemm, kcu::GemmContext::Create());
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
  if (config.quantization) {
    // FP8 linears run through CudaLinear's FP8 parts (cuda_linear.h); what
    // they cannot run is refused here, before any device call.
    RETURN_IF_ERROR(CheckCudaFp8Support(
        config, options.shard ? *options.shard : parallel::FullPlan(config)));
  }
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
  RETURN_IF_ERROR(AllocateActivations());
  const int64_t K = m.kv_heads() * c.head_dim;
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

absl::Status CudaModelRunner::AllocateActivations() {
  Impl& m = *impl_;
  const model::ModelConfig& c = config_;
  const int64_t T = options_.max_num_tokens, S = options_.max_num_seqs;
  const int64_t H = c.hidden_size, Q = m.heads() * c.head_dim, K = m.kv_heads() * c.head_dim,
                W = DenseMlpWidth(c, m.plan), V = m.vocab();
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
  CudaActivations& a = m.act;
  const Want wants[] = {
      {&a.residual, T * H * sizeof(float), "residual"},
      {&a.xb, T * H * sizeof(Bf16), "activations"},
      {&a.qkv, T * (Q + 2 * K) * sizeof(Bf16), "qkv"},
      {&a.attn, T * Q * sizeof(Bf16), "attention output"},
      {&a.delta, T * H * sizeof(Bf16), "activations"},
      {&a.gate_up, T * 2 * W * sizeof(Bf16), "gate_up"},
      {&a.act, T * W * sizeof(Bf16), "mlp activations"},
      {&a.rows, m.max_logits_rows * H * sizeof(Bf16), "logits rows"},
      {&a.logits, m.max_logits_rows * V * sizeof(float), "logits"},
  };
  for (const Want& want : wants) {
    ASSIGN_OR_RETURN(*want.buf, AllocateDevice(want.bytes, want.what));
  }
  RETURN_IF_ERROR(AllocateMoeActivations());
  RETURN_IF_ERROR(sampler_.Allocate(m.max_logits_rows));
  for (Impl::SubmittedStep& step : m.submitted) {
    ASSIGN_OR_RETURN(step.tokens, kcu::PinnedBuffer::Allocate(m.max_logits_rows * sizeof(int32_t)));
    ASSIGN_OR_RETURN(step.done, kcu::Event::Create(/*timing=*/false));
  }
  // Decode workspace for the largest graph bucket at a moderate context;
  // EnsureDecodeWorkspace grows it when a step needs more.
  const size_t attn_ws = kcu::PagedAttentionDecodeWorkspaceBytes(
      static_cast<int>(S), static_cast<int>(m.heads()), static_cast<int>(c.head_dim),
      static_cast<int>(std::min<int64_t>(c.max_position_embeddings, 8192)));
  ASSIGN_OR_RETURN(a.attn_workspace,
                   AllocateDevice(std::max<size_t>(attn_ws, 256), "attention workspace"));
  return absl::OkStatus();
}

absl::Status CudaModelRunner::AllocateMoeActivations() {
  Impl& m = *impl_;
  const CudaMoeWeights* moe = nullptr;  // every sparse layer has the same shapes
  for (const CudaLayerWeights& l : m.weights.layers) {
    if (l.moe) moe = &*l.moe;
  }
  if (moe == nullptr) return absl::OkStatus();
  const int64_t T = options_.max_num_tokens, H = config_.hidden_size;
  const int64_t E = moe->router.out, k = moe->routing.top_k;
  CudaActivations& a = m.act;
  a.moe_max_tokens = T;
  // The router's logits, and for steps above the fused router's limit its
  // input's hi/lo halves and both halves' logits (kernels/cuda/moe_router.h).
  ASSIGN_OR_RETURN(a.router_logits, AllocateDevice(2 * T * E * sizeof(float), "router logits"));
  ASSIGN_OR_RETURN(a.router_split, AllocateDevice(2 * T * H * sizeof(Bf16), "router input"));
  ASSIGN_OR_RETURN(a.router_counters, AllocateDevice(T * sizeof(int32_t), "router counters"));
  RETURN_IF_ERROR(kcu::MemsetDevice(a.router_counters.data(), 0, a.router_counters.size()));
  ASSIGN_OR_RETURN(a.moe_ids, AllocateDevice(T * k * sizeof(int32_t), "expert ids"));
  ASSIGN_OR_RETURN(a.moe_weights, AllocateDevice(T * k * sizeof(float), "expert weights"));
  if (moe->has_shared()) {
    ASSIGN_OR_RETURN(a.shared_out, AllocateDevice(T * H * sizeof(Bf16), "shared experts"));
  }
  const size_t ws = kcu::MoeExpertsWorkspaceBytes(T, static_cast<int>(k), moe->experts(H));
  ASSIGN_OR_RETURN(a.moe_workspace, AllocateDevice(ws, "MoE experts workspace"));
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
  const int64_t S = m.plan.shared_intermediate.size;
  p.shared_gate_up_silu_in_gemv =
      S > 0 && m.weights.gate_up_interleaved && m.gemm->StagedTakes(tokens, 2 * S, H);
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
  c.routing_observer = options_.routing_observer;

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

absl::StatusOr<CudaModelRunner::StepShape> CudaModelRunner::PrepareStep(
    const ForwardBatch& batch) const {
  RETURN_IF_ERROR(ValidateBatch(batch));
  StepShape shape;
  shape.seqs = batch.num_seqs();
  shape.tokens = batch.num_tokens();
  shape.logits_rows = static_cast<int64_t>(batch.logits_indices.size());
  for (int i = 0; i < shape.seqs; ++i) {
    shape.max_seq_len = std::max(shape.max_seq_len, batch.seq_lens[i]);
    shape.max_query_len =
        std::max(shape.max_query_len, batch.query_start_loc[i + 1] - batch.query_start_loc[i]);
  }
  if (shape.logits_rows > impl_->max_logits_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        shape.logits_rows, " logits rows exceed the runner's ", impl_->max_logits_rows));
  }
  return shape;
}

absl::Status CudaModelRunner::Execute(const ForwardBatch& batch, int64_t* num_logits) {
  ASSIGN_OR_RETURN(const StepShape shape, PrepareStep(batch));
  // The sampler's ids are about to stop being a submitted step's draws.
  impl_->previous_rows = -1;
  // Padded rows follow in a graph step; callers read the first logits_rows.
  *num_logits = shape.logits_rows;
  return Execute(batch, shape, {});
}

absl::Status CudaModelRunner::Execute(const ForwardBatch& batch, const StepShape& shape,
                                      absl::Span<const PreviousStepToken> from_previous) {
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  // Graph path: a decode step whose every sequence wants its logits.
  const bool graph = shape.decode() && options_.cuda_graphs &&
                     shape.seqs <= options_.max_graph_batch && shape.logits_rows == shape.seqs;
  return graph ? RunDecodeGraph(batch, shape, from_previous)
               : RunEager(batch, shape, from_previous);
}

absl::StatusOr<bool> CudaModelRunner::StageStep(const ForwardBatch& batch, int64_t padded_tokens,
                                                int padded_seqs, int context,
                                                absl::Span<const PreviousStepToken> from_previous) {
  Impl& m = *impl_;
  ASSIGN_OR_RETURN(const bool tree,
                   m.batch->Stage(batch, padded_tokens, padded_seqs, context, options_.block_size,
                                  m.plan.vocab.start, from_previous, m.stream.get()));
  // After the staging copy, before the step reads them (a graph reads them
  // from the same staged buffer).
  RETURN_IF_ERROR(
      m.batch->TakePreviousTokens(sampler_.drawn_ids(), config_.vocab_size, m.stream.get()));
  return tree;
}

absl::Status CudaModelRunner::RunEager(const ForwardBatch& batch, const StepShape& shape,
                                       absl::Span<const PreviousStepToken> from_previous) {
  Impl& m = *impl_;
  if (shape.decode()) RETURN_IF_ERROR(EnsureDecodeWorkspace(shape.seqs, shape.max_seq_len));
  absl::StatusOr<bool> tree =
      StageStep(batch, shape.tokens, shape.seqs, shape.max_seq_len, from_previous);
  if (!tree.ok()) return tree.status();
  // A branching chunk has at least two tokens, so a tree step is never a
  // decode step.
  if (*tree && shape.decode()) return absl::InternalError("a branching chunk in a decode step");
  return RunModel(PlanStep(shape.tokens, shape.seqs, shape.logits_rows, shape.decode(),
                           shape.max_seq_len, shape.max_query_len, *tree));
}

absl::Status CudaModelRunner::RunDecodeGraph(const ForwardBatch& batch, const StepShape& shape,
                                             absl::Span<const PreviousStepToken> from_previous) {
  Impl& m = *impl_;
  const DecodeBucket bucket = DecodeBucketFor(shape.seqs, shape.max_seq_len, options_.max_num_seqs,
                                              config_.max_position_embeddings);
  RETURN_IF_ERROR(EnsureDecodeWorkspace(bucket.seqs, bucket.context));
  absl::StatusOr<bool> tree =
      StageStep(batch, bucket.seqs, bucket.seqs, bucket.context, from_previous);
  if (!tree.ok()) return tree.status();
  if (*tree) return absl::InternalError("a branching chunk in a decode step");
  const StepPlan plan =
      PlanStep(bucket.seqs, bucket.seqs, bucket.seqs, true, bucket.context, 1, /*tree=*/false);
  return graphs_.Launch(bucket, options_.gemm_autotune ? m.gemm.get() : nullptr, m.stream.get(),
                        [&] { return RunModel(plan); });
}

absl::Status CudaModelRunner::EnsureDecodeWorkspace(int seqs, int context) {
  Impl& m = *impl_;
  const size_t need = kcu::PagedAttentionDecodeWorkspaceBytes(
      seqs, static_cast<int>(m.heads()), static_cast<int>(config_.head_dim), context);
  if (need <= m.act.attn_workspace.size()) return absl::OkStatus();
  // Captured graphs hold the old pointer.
  RETURN_IF_ERROR(kcu::Synchronize(m.stream.get()));
  graphs_.Clear();
  m.act.attn_workspace = DeviceBuffer();
  ASSIGN_OR_RETURN(m.act.attn_workspace, AllocateDevice(need, "attention workspace"));
  return absl::OkStatus();
}

kcu::CudaStream CudaModelRunner::stream() const { return impl_->stream.get(); }

absl::Status CudaModelRunner::Synchronize() {
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  logits->resize(static_cast<size_t>(rows * impl_->vocab()));
  if (rows > 0) {
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
  RETURN_IF_ERROR(sampler_.Greedy(impl_->act.logits.as<float>(), rows, config_.vocab_size, tokens,
                                  impl_->stream.get()));
  return kcu::Synchronize(impl_->stream.get());
}

absl::Status CudaModelRunner::ForwardTopOne(const ForwardBatch& batch, std::vector<int32_t>* ids,
                                            std::vector<float>* values) {
  int64_t rows = 0;
  RETURN_IF_ERROR(Execute(batch, &rows));
  Impl& m = *impl_;
  RETURN_IF_ERROR(sampler_.TopOne(m.act.logits.as<float>(), rows, m.vocab(), m.plan.vocab.start,
                                  ids, values, m.stream.get()));
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
  if (impl_->in_flight > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("ForwardSample with ", impl_->in_flight,
                     " submitted step(s) not collected; CollectSample them first"));
  }
  RETURN_IF_ERROR(SubmitSample(batch, rows, {}));
  return CollectSample(tokens);
}

int CudaModelRunner::steps_in_flight() const { return impl_->in_flight; }

absl::Status CudaModelRunner::CheckFromPrevious(
    const ForwardBatch& batch, absl::Span<const PreviousStepToken> from_previous) const {
  if (from_previous.empty()) return absl::OkStatus();
  const int64_t rows = impl_->previous_rows;
  if (rows < 0) {
    return absl::InvalidArgumentError(
        "tokens from the previous step, but the step just before was not a successful "
        "SubmitSample (the device's drawn ids are not that step's)");
  }
  if (static_cast<int64_t>(from_previous.size()) > batch.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        from_previous.size(), " previous-step tokens for a batch of ", batch.num_tokens()));
  }
  for (const PreviousStepToken& p : from_previous) {
    if (p.token_index < 0 || p.token_index >= batch.num_tokens() || p.row < 0 || p.row >= rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "previous-step token ", p.token_index, " from row ", p.row, " is out of range (",
          batch.num_tokens(), " tokens; the previous step drew ", rows, " rows)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::SubmitSample(const ForwardBatch& batch,
                                           absl::Span<const DeviceSamplingRow> rows,
                                           absl::Span<const PreviousStepToken> from_previous) {
  Impl& m = *impl_;
  if (!SupportsAsyncSampling()) {
    return absl::FailedPreconditionError("sampling on the device needs the whole vocabulary");
  }
  if (m.in_flight == static_cast<int>(m.submitted.size())) {
    return absl::FailedPreconditionError(
        "two steps are submitted and not collected already; CollectSample the oldest first");
  }
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  if (static_cast<int64_t>(rows.size()) != r) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows.size(), " sampling rows for ", r, " logits rows"));
  }
  RETURN_IF_ERROR(CheckFromPrevious(batch, from_previous));
  ASSIGN_OR_RETURN(const StepShape shape, PrepareStep(batch));
  // Valid: from here the device works on it. Until it is queued whole the
  // sampler's ids are nobody's draws.
  m.previous_rows = -1;
  Impl::SubmittedStep& step = m.submitted[(m.oldest + m.in_flight) % m.submitted.size()];
  RETURN_IF_ERROR(Execute(batch, shape, from_previous));
  RETURN_IF_ERROR(
      sampler_.QueueSample(m.act.logits.as<float>(), r, m.vocab(), rows, m.stream.get()));
  RETURN_IF_ERROR(kcu::CopyToHost(step.tokens.data(), sampler_.drawn_ids(), r * sizeof(int32_t),
                                  m.stream.get()));
  RETURN_IF_ERROR(step.done.Record(m.stream.get()));
  step.rows = r;
  ++m.in_flight;
  m.previous_rows = r;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::CollectSample(std::vector<int32_t>* tokens) {
  Impl& m = *impl_;
  if (m.in_flight == 0) return absl::FailedPreconditionError("no submitted step to collect");
  Impl::SubmittedStep& step = m.submitted[m.oldest];
  m.oldest = (m.oldest + 1) % static_cast<int>(m.submitted.size());
  --m.in_flight;
  // Only this step's copy: a step submitted after it may still run.
  RETURN_IF_ERROR(step.done.Synchronize());
  const int32_t* drawn = step.tokens.as<int32_t>();
  tokens->assign(drawn, drawn + step.rows);
  return absl::OkStatus();
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
  RETURN_IF_ERROR(kcu::SetDevice(impl_->ordinal));
  impl_->previous_rows = -1;  // the sampler's ids become these draws
  return sampler_.SampleSlices(slices, r, config_.vocab_size, impl_->ordinal, rows, tokens,
                               impl_->stream.get());
}

}  // namespace tessera::runner
