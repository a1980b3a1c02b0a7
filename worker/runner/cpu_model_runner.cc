#include "worker/runner/cpu_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/rope.h"

namespace tessera::runner {
namespace {

namespace kc = ::tessera::kernels::cpu;

}  // namespace

struct CpuModelRunner::Layer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  CpuLinear qkv, o;                     // dense or FP8 (cpu_linear.h)
  std::vector<float> qkv_bias, o_bias;  // empty = none
  CpuMlpBlock mlp;                      // dense SwiGLU or mixture of experts
  kc::PagedKvCache cache;               // MLA: k = v = the latent rows
  std::optional<CpuMlaAttention> mla;   // multi-head latent attention
};

CpuModelRunner::CpuModelRunner(const model::LoadedModel* model, CpuRunnerOptions options)
    : model_(model), options_(std::move(options)) {}

CpuModelRunner::~CpuModelRunner() = default;

absl::StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    const model::LoadedModel* model, CpuRunnerOptions options) {
  if (options.block_size < 1 || options.num_kv_blocks < 1) {
    return absl::InvalidArgumentError("block_size and num_kv_blocks must be >= 1");
  }
  parallel::ShardPlan plan = parallel::FullPlan(model->config);
  if (options.shard) {
    auto checked = parallel::PlanShard(model->config, options.shard->rank, options.shard->size,
                                       options.shard->moe_parallelism);
    if (!checked.ok()) return checked.status();
    plan = *options.shard;
    if (model->config.mla && plan.sharded()) {
      return absl::UnimplementedError(
          "multi-head latent attention (DeepseekV3ForCausalLM) is not supported with tensor "
          "parallelism on the CPU yet");
    }
    if (model->config.quantization && plan.sharded()) {
      return absl::UnimplementedError(
          absl::StrCat("FP8 checkpoints (", model->config.quantization->Describe(),
                       ") are not supported with tensor parallelism on the CPU yet"));
    }
    if (plan.sharded() &&
        (options.collectives == nullptr || options.collectives->size() != plan.size ||
         options.collectives->rank() != plan.rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat(plan.ToString(), ": needs the collectives of that rank"));
    }
  }
  std::unique_ptr<CpuModelRunner> runner(new CpuModelRunner(model, std::move(options)));
  runner->plan_ = plan;
  runner->kernels_ =
      runner->options_.kernels ? *runner->options_.kernels : kernels::OptimizedCpuKernels();
  runner->ctx_ = kc::DefaultCpuContext();
  if (runner->options_.num_threads > 0) {
    runner->own_pool_ = std::make_unique<kc::ThreadPool>(runner->options_.num_threads);
    runner->ctx_.pool = runner->own_pool_.get();
  }
  if (auto s = runner->PrepareWeights(); !s.ok()) return s;
  return runner;
}

absl::Status CpuModelRunner::PrepareWeights() {
  const model::ModelConfig& c = model_->config;
  const model::ModelWeights& w = model_->weights;
  const parallel::ShardPlan& p = plan_;
  CpuWeightLoader& load = loader_;

  auto embed_rows = CpuWeightLoader::Rows(w.embed_tokens, p.vocab);
  if (!embed_rows.ok()) return embed_rows.status();
  auto embed = load.Matrix(*embed_rows);
  if (!embed.ok()) return embed.status();
  embed_ = *embed;
  auto head_rows = CpuWeightLoader::Rows(w.lm_head, p.vocab);
  if (!head_rows.ok()) return head_rows.status();
  auto head = load.Matrix(*head_rows);
  if (!head.ok()) return head.status();
  lm_head_ = *head;
  auto final_norm = CpuWeightLoader::Floats(w.norm);
  if (!final_norm.ok()) return final_norm.status();
  final_norm_ = std::move(*final_norm);
  auto inv_freq = model::RopeInverseFrequencies(c);
  if (!inv_freq.ok()) return inv_freq.status();
  inv_freq_ = std::move(*inv_freq);

  const int64_t slots = options_.num_kv_blocks * options_.block_size;
  // MLA: one latent row per slot (k_cache_ holds it; no V).
  const int64_t slot_values = c.mla ? c.mla->latent_dim() : p.kv_heads.size * c.head_dim;
  const int64_t layer_elems = slots * slot_values;
  k_cache_.assign(static_cast<size_t>(layer_elems * c.num_hidden_layers), 0.0f);
  v_cache_.assign(c.mla ? 0 : static_cast<size_t>(layer_elems * c.num_hidden_layers), 0.0f);

  layers_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer& l = layers_[i];
    if (auto s = PrepareAttention(w.layers[i], &l); !s.ok()) return s;
    auto mlp = CpuMlpBlock::Prepare(c, static_cast<int>(i), w.layers[i], p, &load);
    if (!mlp.ok()) return mlp.status();
    l.mlp = std::move(*mlp);
    l.cache.k = k_cache_.data() + i * layer_elems;
    l.cache.v = c.mla ? l.cache.k : v_cache_.data() + i * layer_elems;
    l.cache.num_blocks = options_.num_kv_blocks;
    l.cache.block_size = options_.block_size;
    l.cache.num_kv_heads = c.mla ? 1 : static_cast<int>(p.kv_heads.size);
    l.cache.head_dim = static_cast<int>(slot_values / l.cache.num_kv_heads);
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::PrepareAttention(const model::LayerWeights& lw, Layer* l) {
  const parallel::ShardPlan& p = plan_;
  const int64_t D = model_->config.head_dim;
  const parallel::Range q_rows{p.q_heads.start * D, p.q_heads.size * D};
  const parallel::Range kv_rows{p.kv_heads.start * D, p.kv_heads.size * D};
  for (auto [from, to] : {std::pair{&lw.input_layernorm, &l->input_norm},
                          std::pair{&lw.post_attention_layernorm, &l->post_norm}}) {
    auto v = CpuWeightLoader::Floats(*from);
    if (!v.ok()) return v.status();
    *to = std::move(*v);
  }
  for (auto [from, to] : {std::pair{&lw.q_norm, &l->q_norm}, std::pair{&lw.k_norm, &l->k_norm}}) {
    auto v = CpuWeightLoader::Floats(*from);
    if (!v.ok()) return v.status();
    *to = std::move(*v);
  }
  if (model_->config.mla) {
    auto mla = CpuMlaAttention::Prepare(model_->config, lw, inv_freq_, &loader_);
    if (!mla.ok()) return mla.status();
    l->mla = *std::move(mla);
    return absl::OkStatus();
  }

  // Column-parallel: this rank's heads of q/k/v.
  auto q = CpuWeightLoader::Rows(lw.q_proj, q_rows);
  auto k = CpuWeightLoader::Rows(lw.k_proj, kv_rows);
  auto v = CpuWeightLoader::Rows(lw.v_proj, kv_rows);
  if (!q.ok()) return q.status();
  if (!k.ok()) return k.status();
  if (!v.ok()) return v.status();
  auto qkv = CpuLinear::Prepare({&*q, &*k, &*v}, lw, model_->config.quantization, &loader_);
  if (!qkv.ok()) return qkv.status();
  l->qkv = *std::move(qkv);
  if (lw.q_bias) {
    const std::pair<const std::optional<model::TensorView>*, parallel::Range> parts[] = {
        {&lw.q_bias, q_rows}, {&lw.k_bias, kv_rows}, {&lw.v_bias, kv_rows}};
    for (const auto& [b, r] : parts) {
      auto part = CpuWeightLoader::Floats(**b, r);
      if (!part.ok()) return part.status();
      l->qkv_bias.insert(l->qkv_bias.end(), part->begin(), part->end());
    }
  }

  // Row-parallel: the matching input columns of o_proj; the partial sums
  // are all-reduced, so only rank 0 adds the bias.
  if (lw.Fp8ScalesOf(lw.o_proj) != nullptr) {  // unsharded (checked in Create)
    auto o = CpuLinear::Prepare({&lw.o_proj}, lw, model_->config.quantization, &loader_);
    if (!o.ok()) return o.status();
    l->o = *std::move(o);
  } else {
    auto o = loader_.Columns(lw.o_proj, q_rows);
    if (!o.ok()) return o.status();
    l->o.dense = *o;
    l->o.rows = o->rows;
    l->o.cols = o->cols;
  }
  if (p.add_row_bias) {
    auto o_bias = CpuWeightLoader::Floats(lw.o_bias);
    if (!o_bias.ok()) return o_bias.status();
    l->o_bias = std::move(*o_bias);
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::ValidateBatch(const ForwardBatch& b) const {
  const model::ModelConfig& c = model_->config;
  if (auto st = ValidateForwardBatch(
          b, {c.vocab_size, c.max_position_embeddings, options_.block_size, options_.num_kv_blocks,
              /*tree_attention=*/true});
      !st.ok()) {
    return st;
  }
  // What the CPU kernels add: every token writes its K/V (no negative
  // slots), and the attention kernel's own argument checks.
  const kc::PagedKvCache& cache = layers_[0].cache;
  if (auto st = kc::ValidateSlotMapping(b.slot_mapping, cache); !st.ok()) return st;
  kc::PagedAttentionArgs args;
  float dummy = 0;
  args.q = &dummy;
  args.q_token_stride = plan_.q_heads.size * (c.mla ? cache.head_dim : c.head_dim);
  args.num_heads = static_cast<int>(plan_.q_heads.size);
  args.cache = cache;
  args.query_start_loc = b.query_start_loc;
  args.seq_lens = b.seq_lens;
  args.block_tables = b.block_tables;
  args.block_table_stride = b.block_table_stride;
  args.out = &dummy;
  return kc::ValidatePagedAttention(args);
}

void CpuModelRunner::RunLayer(int index, const ForwardBatch& batch, int64_t n) {
  const model::ModelConfig& c = model_->config;
  const Layer& l = layers_[index];
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const kernels::CpuKernels& k = kernels_;

  // x holds this layer's input (normalized below); residual the stream.
  if (index == 0) {
    std::memcpy(residual_.data(), x_.data(), sizeof(float) * n * H);
    k.rms_norm(ctx_, x_.data(), l.input_norm.data(), n, H, eps, x_.data());
  } else {
    k.fused_add_rms_norm(ctx_, x_.data(), residual_.data(), l.input_norm.data(), n, H, eps);
  }

  if (l.mla) {  // multi-head latent attention (cpu_mla_attention.h)
    const MlaLatentCache cache{l.cache.k, l.cache.num_slots(), l.cache.head_dim,
                               l.cache.block_size};
    l.mla->Run(ctx_, k, x_.data(), batch, cache, options_.mla_form, &mla_scratch_, mlp_out_.data());
    std::swap(x_, mlp_out_);
  } else {
    RunAttention(l, batch, n);
  }
  AllReduce(x_.data(), n * H);

  // MLP: dense SwiGLU or mixture of experts (cpu_mlp_block.h).
  k.fused_add_rms_norm(ctx_, x_.data(), residual_.data(), l.post_norm.data(), n, H, eps);
  l.mlp.Run(ctx_, k, x_.data(), n, &mlp_scratch_, mlp_out_.data(), options_.routing_observer);
  std::swap(x_, mlp_out_);
  AllReduce(x_.data(), n * H);
}

void CpuModelRunner::RunAttention(const Layer& l, const ForwardBatch& batch, int64_t n) {
  const model::ModelConfig& c = model_->config;
  const int64_t D = c.head_dim;
  const int64_t Q = plan_.q_heads.size * D, K = plan_.kv_heads.size * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const kernels::CpuKernels& k = kernels_;
  const float* qkv_bias = l.qkv_bias.empty() ? nullptr : l.qkv_bias.data();
  l.qkv.Apply(ctx_, k, x_.data(), n, qkv_bias, qkv_.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv_.data() + t * (Q + 2 * K);
    std::memcpy(q_.data() + t * Q, row, sizeof(float) * Q);
    std::memcpy(k_.data() + t * K, row + Q, sizeof(float) * K);
    std::memcpy(v_.data() + t * K, row + Q + K, sizeof(float) * K);
  }
  const int heads = static_cast<int>(plan_.q_heads.size);
  const int kv_heads = static_cast<int>(plan_.kv_heads.size);
  if (!l.q_norm.empty()) {
    k.rms_norm(ctx_, q_.data(), l.q_norm.data(), n * heads, D, eps, q_.data());
    k.rms_norm(ctx_, k_.data(), l.k_norm.data(), n * kv_heads, D, eps, k_.data());
  }
  ApplyRope(batch, heads, kv_heads);
  // Batch validated up front: these cannot fail.
  (k.write_kv_cache(ctx_, k_.data(), K, v_.data(), K, batch.slot_mapping, l.cache)).IgnoreError();
  kc::PagedAttentionArgs args;
  args.q = q_.data();
  args.q_token_stride = Q;
  args.num_heads = heads;
  args.cache = l.cache;
  args.query_start_loc = batch.query_start_loc;
  args.seq_lens = batch.seq_lens;
  args.block_tables = batch.block_tables;
  args.block_table_stride = batch.block_table_stride;
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  args.out = attn_.data();
  (k.attention_prefill(ctx_, args)).IgnoreError();
  if (!batch.tree_parents.empty()) TreeAttention(l, batch, args.scale);
  const float* o_bias = l.o_bias.empty() ? nullptr : l.o_bias.data();
  l.o.Apply(ctx_, k, attn_.data(), n, o_bias, x_.data());
}

void CpuModelRunner::ApplyRope(const ForwardBatch& batch, int heads, int kv_heads) {
  const int64_t D = model_->config.head_dim;
  const int64_t Q = heads * D, K = kv_heads * D;
  const int rotary = static_cast<int>(model_->config.rotary_dim());
  if (rotary == D) {
    kernels_.rope(ctx_, batch.positions, inv_freq_, rotary, q_.data(), heads, Q, k_.data(),
                  kv_heads, K);
    return;
  }
  // Partial RoPE (GLM-4.5): the first `rotary` dims of each head rotate as a
  // head of that size (rotate_half over them); the rest pass through. One
  // call per head, since the kernel spaces heads by its head_dim (there are
  // at least as many query heads as KV heads).
  for (int h = 0; h < heads; ++h) {
    float* k = h < kv_heads ? k_.data() + h * D : nullptr;
    kernels_.rope(ctx_, batch.positions, inv_freq_, rotary, q_.data() + h * D, 1, Q, k, k ? 1 : 0,
                  K);
  }
}

void CpuModelRunner::TreeAttention(const Layer& l, const ForwardBatch& batch, float scale) {
  const int D = l.cache.head_dim;
  const int heads = static_cast<int>(plan_.q_heads.size);
  const int group = heads / l.cache.num_kv_heads;
  const int64_t Q = int64_t{heads} * D;
  const int64_t stride = l.cache.slot_stride();
  const int bs = l.cache.block_size;
  // (token, head) pairs of the chunks that branch.
  std::vector<int32_t> work;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int begin = batch.query_start_loc[s], end = batch.query_start_loc[s + 1];
    bool chain = true;
    for (int t = begin; t < end; ++t) chain &= batch.tree_parents[t] == t - begin - 1;
    if (chain) continue;
    for (int t = begin; t < end; ++t) {
      for (int h = 0; h < heads; ++h) work.push_back(t * heads + h);
    }
  }
  if (work.empty()) return;
  std::vector<int32_t> seq_of(batch.num_tokens());
  for (int s = 0; s < batch.num_seqs(); ++s) {
    for (int t = batch.query_start_loc[s]; t < batch.query_start_loc[s + 1]; ++t) seq_of[t] = s;
  }
  auto run = [&](int64_t from, int64_t to) {
    std::vector<int64_t> slots;
    std::vector<float> scores;
    std::vector<float> acc(D);
    for (int64_t w = from; w < to; ++w) {
      const int t = work[w] / heads, h = work[w] % heads;
      const int s = seq_of[t];
      const int begin = batch.query_start_loc[s];
      const int q_len = batch.query_start_loc[s + 1] - begin;
      const int start = batch.seq_lens[s] - q_len;
      const int32_t* table = batch.block_tables.data() + s * batch.block_table_stride;
      auto slot_of = [&](int index) { return int64_t{table[index / bs]} * bs + index % bs; };
      // The cached context, then the token's ancestors (root first) and itself.
      slots.clear();
      for (int c = 0; c < start; ++c) slots.push_back(slot_of(c));
      const size_t context = slots.size();
      for (int j = t - begin; j >= 0; j = batch.tree_parents[begin + j]) {
        slots.push_back(slot_of(start + j));
      }
      std::reverse(slots.begin() + context, slots.end());
      const float* q = q_.data() + t * Q + int64_t{h} * D;
      const int64_t head_offset = int64_t{h / group} * D;
      scores.resize(slots.size());
      float max_score = -std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < slots.size(); ++i) {
        const float* key = l.cache.k + slots[i] * stride + head_offset;
        float dot = 0;
        for (int d = 0; d < D; ++d) dot += q[d] * key[d];
        scores[i] = dot * scale;
        max_score = std::max(max_score, scores[i]);
      }
      float total = 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t i = 0; i < slots.size(); ++i) {
        const float e = std::exp(scores[i] - max_score);
        total += e;
        const float* value = l.cache.v + slots[i] * stride + head_offset;
        for (int d = 0; d < D; ++d) acc[d] += e * value[d];
      }
      float* out = attn_.data() + t * Q + int64_t{h} * D;
      for (int d = 0; d < D; ++d) out[d] = acc[d] / total;
    }
  };
  const int64_t n = static_cast<int64_t>(work.size());
  if (ctx_.pool != nullptr) {
    ctx_.pool->ParallelFor(n, 4, run);
  } else {
    run(0, n);
  }
}

absl::Status CpuModelRunner::CopyKvSlots(absl::Span<const int64_t> from,
                                         absl::Span<const int64_t> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyKvSlots: ", from.size(), " sources but ", to.size(), " destinations"));
  }
  const int64_t num_slots = options_.num_kv_blocks * options_.block_size;
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] < 0 || from[i] >= num_slots || to[i] < 0 || to[i] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKvSlots: slot pair ", i, " (", from[i],
                                                     " -> ", to[i], ") outside the cache of ",
                                                     num_slots, " slots"));
    }
  }
  for (const Layer& l : layers_) {
    const int64_t stride = l.cache.slot_stride();
    for (size_t i = 0; i < from.size(); ++i) {
      if (from[i] == to[i]) continue;
      std::memcpy(l.cache.k + to[i] * stride, l.cache.k + from[i] * stride, sizeof(float) * stride);
      if (l.cache.v == l.cache.k) continue;  // MLA: the latent row is all
      std::memcpy(l.cache.v + to[i] * stride, l.cache.v + from[i] * stride, sizeof(float) * stride);
    }
  }
  return absl::OkStatus();
}

void CpuModelRunner::AllReduce(float* data, int64_t n) {
  if (plan_.sharded()) options_.collectives->AllReduceSum(ctx_, data, n);
}

void CpuModelRunner::Embed(const ForwardBatch& batch, int64_t n) {
  const int64_t H = model_->config.hidden_size;
  // Batch validated up front: the lookups cannot fail.
  if (!plan_.sharded()) {
    (kernels_.embedding(ctx_, embed_, batch.token_ids, x_.data())).IgnoreError();
    return;
  }
  // Vocab-parallel: rows for the ids in this rank's slice, zeros elsewhere;
  // exactly one rank contributes each row, so the all-reduce is exact.
  local_ids_.clear();
  local_rows_.clear();
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = batch.token_ids[t];
    if (plan_.vocab.Contains(id)) {
      local_ids_.push_back(static_cast<int32_t>(id - plan_.vocab.start));
      local_rows_.push_back(t);
    }
  }
  std::fill(x_.begin(), x_.end(), 0.0f);
  if (!local_ids_.empty()) {
    local_embed_.resize(local_ids_.size() * H);
    (kernels_.embedding(ctx_, embed_, local_ids_, local_embed_.data())).IgnoreError();
    for (size_t j = 0; j < local_rows_.size(); ++j) {
      std::memcpy(x_.data() + local_rows_[j] * H, local_embed_.data() + j * H, sizeof(float) * H);
    }
  }
  AllReduce(x_.data(), n * H);
}

absl::Status CpuModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  if (auto s = ValidateBatch(batch); !s.ok()) return s;
  const model::ModelConfig& c = model_->config;
  const int64_t n = batch.num_tokens();
  const int64_t H = c.hidden_size, Q = plan_.q_heads.size * c.head_dim,
                K = plan_.kv_heads.size * c.head_dim;
  x_.resize(n * H);
  residual_.resize(n * H);
  qkv_.resize(n * (Q + 2 * K));
  q_.resize(n * Q);
  k_.resize(n * K);
  v_.resize(n * K);
  attn_.resize(n * Q);
  mlp_out_.resize(n * H);

  Embed(batch, n);
  for (int i = 0; i < c.num_hidden_layers; ++i) RunLayer(i, batch, n);

  // Final norm and LM head, only for the rows whose logits are wanted.
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  const bool root = plan_.rank == 0;
  if (root) {
    logits->assign(static_cast<size_t>(r * c.vocab_size), 0.0f);
  } else {
    logits->clear();
  }
  if (r == 0) return absl::OkStatus();
  rows_.resize(r * H);
  std::vector<float> rows_residual(r * H);
  for (int64_t j = 0; j < r; ++j) {
    int64_t t = batch.logits_indices[j];
    std::memcpy(rows_.data() + j * H, x_.data() + t * H, sizeof(float) * H);
    std::memcpy(rows_residual.data() + j * H, residual_.data() + t * H, sizeof(float) * H);
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  kernels_.fused_add_rms_norm(ctx_, rows_.data(), rows_residual.data(), final_norm_.data(), r, H,
                              eps);
  if (!plan_.sharded()) {
    kernels_.gemm(ctx_, rows_.data(), r, lm_head_, nullptr, logits->data());
    return absl::OkStatus();
  }
  // Vocab-parallel LM head: this rank's columns of the logits, gathered.
  local_logits_.resize(r * plan_.vocab.size);
  kernels_.gemm(ctx_, rows_.data(), r, lm_head_, nullptr, local_logits_.data());
  options_.collectives->GatherColumnsToRoot(local_logits_.data(), r, plan_.vocab.size,
                                            plan_.vocab.start, c.vocab_size,
                                            root ? logits->data() : nullptr);
  return absl::OkStatus();
}

}  // namespace tessera::runner
