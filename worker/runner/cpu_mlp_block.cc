#include "worker/runner/cpu_mlp_block.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::runner {
namespace {

namespace kc = ::tessera::kernels::cpu;

template <typename T>
void Grow(std::vector<T>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
}

kc::MoeRoutingParams RoutingParams(const model::MoeConfig& m) {
  kc::MoeRoutingParams p;
  p.scoring = m.scoring == model::MoeScoring::kSoftmax ? kc::MoeScoringFunction::kSoftmax
                                                       : kc::MoeScoringFunction::kSigmoidGrouped;
  p.num_experts = static_cast<int>(m.num_experts);
  p.top_k = static_cast<int>(m.top_k);
  p.renormalize = m.norm_topk_prob;
  p.num_groups = static_cast<int>(m.n_group);
  p.topk_groups = static_cast<int>(m.topk_group);
  p.scaling_factor = static_cast<float>(m.routed_scaling_factor);
  return p;
}

}  // namespace

absl::StatusOr<CpuMlpBlock::SwiGlu> CpuMlpBlock::PrepareSwiGlu(
    const model::ModelConfig& config, const model::LayerWeights& layer,
    const model::TensorView& gate, const model::TensorView& up, const model::TensorView& down,
    parallel::Range rows, CpuWeightLoader* loader) {
  // Column-parallel gate/up (this rank's rows), row-parallel down.
  auto gate_rows = CpuWeightLoader::Rows(gate, rows);
  if (!gate_rows.ok()) return gate_rows.status();
  auto up_rows = CpuWeightLoader::Rows(up, rows);
  if (!up_rows.ok()) return up_rows.status();
  SwiGlu s;
  s.width = rows.size;
  auto gate_up = CpuLinear::Prepare({&*gate_rows, &*up_rows}, layer, config.quantization, loader);
  if (!gate_up.ok()) return gate_up.status();
  s.gate_up = *std::move(gate_up);
  if (layer.Fp8ScalesOf(down) != nullptr) {  // FP8 runs unsharded (CpuModelRunner::Create)
    auto fp8_down = CpuLinear::Prepare({&down}, layer, config.quantization, loader);
    if (!fp8_down.ok()) return fp8_down.status();
    s.down = *std::move(fp8_down);
    return s;
  }
  auto down_cols = loader->Columns(down, rows);
  if (!down_cols.ok()) return down_cols.status();
  s.down.dense = *down_cols;
  s.down.rows = down_cols->rows;
  s.down.cols = down_cols->cols;
  return s;
}

absl::StatusOr<CpuMlpBlock::Moe> CpuMlpBlock::PrepareMoe(const model::ModelConfig& config,
                                                         const model::LayerWeights& layer,
                                                         const parallel::ShardPlan& plan,
                                                         CpuWeightLoader* loader) {
  const model::MoeWeights& w = *layer.moe;
  Moe moe;
  moe.routing = RoutingParams(*config.moe);
  if (auto s = kc::ValidateMoeRouting(moe.routing); !s.ok()) return s;
  auto router = loader->Matrix(w.router);  // replicated: every rank routes every token
  if (!router.ok()) return router.status();
  moe.router = *router;
  auto bias = CpuWeightLoader::Floats(w.correction_bias);
  if (!bias.ok()) return bias.status();
  moe.correction_bias = std::move(*bias);
  moe.first_expert = static_cast<int32_t>(plan.experts.start);
  for (int64_t e = plan.experts.start; e < plan.experts.end(); ++e) {
    const model::ExpertWeights& ew = w.experts[e];
    auto expert = PrepareSwiGlu(config, layer, ew.gate_proj, ew.up_proj, ew.down_proj,
                                plan.expert_intermediate, loader);
    if (!expert.ok()) return expert.status();
    if (expert->gate_up.is_fp8() || expert->down.is_fp8()) {
      return absl::UnimplementedError(
          absl::StrCat(ew.gate_proj.name,
                       ": FP8 experts are not supported on the CPU yet (the expert kernels "
                       "take bf16/fp16/fp32 weights)"));
    }
    moe.gate_up.push_back(expert->gate_up.dense);
    moe.down.push_back(expert->down.dense);
  }
  if (w.shared) {
    auto shared = PrepareSwiGlu(config, layer, w.shared->gate_proj, w.shared->up_proj,
                                w.shared->down_proj, plan.shared_intermediate, loader);
    if (!shared.ok()) return shared.status();
    moe.shared = std::move(*shared);
  }
  return moe;
}

absl::StatusOr<CpuMlpBlock> CpuMlpBlock::Prepare(const model::ModelConfig& config, int layer,
                                                 const model::LayerWeights& w,
                                                 const parallel::ShardPlan& plan,
                                                 CpuWeightLoader* loader) {
  CpuMlpBlock block;
  block.layer_ = layer;
  block.hidden_ = config.hidden_size;
  if (w.moe) {
    auto moe = PrepareMoe(config, w, plan, loader);
    if (!moe.ok()) return moe.status();
    block.moe_ = std::move(*moe);
    return block;
  }
  auto dense =
      PrepareSwiGlu(config, w, w.gate_proj, w.up_proj, w.down_proj, plan.intermediate, loader);
  if (!dense.ok()) return dense.status();
  if (w.gate_bias) {
    for (const auto* b : {&w.gate_bias, &w.up_bias}) {
      auto part = CpuWeightLoader::Floats(**b, plan.intermediate);
      if (!part.ok()) return part.status();
      dense->gate_up_bias.insert(dense->gate_up_bias.end(), part->begin(), part->end());
    }
  }
  // Row-parallel partial sums are all-reduced, so only rank 0 adds the bias.
  if (plan.add_row_bias) {
    auto down_bias = CpuWeightLoader::Floats(w.down_bias);
    if (!down_bias.ok()) return down_bias.status();
    dense->down_bias = std::move(*down_bias);
  }
  block.dense_ = std::move(*dense);
  return block;
}

void CpuMlpBlock::SwiGlu::Run(const kc::CpuContext& ctx, const kernels::CpuKernels& k,
                              const float* x, int64_t n, MlpScratch* scratch, float* out) const {
  Grow(&scratch->gate_up, n * 2 * width);
  Grow(&scratch->act, n * width);
  const float* gu_bias = gate_up_bias.empty() ? nullptr : gate_up_bias.data();
  gate_up.Apply(ctx, k, x, n, gu_bias, scratch->gate_up.data());
  k.silu_mul(ctx, scratch->gate_up.data(), n, width, scratch->act.data());
  const float* d_bias = down_bias.empty() ? nullptr : down_bias.data();
  down.Apply(ctx, k, scratch->act.data(), n, d_bias, out);
}

void CpuMlpBlock::Run(const kc::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
                      int64_t n, MlpScratch* scratch, float* out,
                      MoeRoutingObserver* observer) const {
  if (moe_) {
    RunMoe(ctx, k, x, n, scratch, out, observer);
  } else {
    dense_->Run(ctx, k, x, n, scratch, out);
  }
}

void CpuMlpBlock::RunMoe(const kc::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
                         int64_t n, MlpScratch* scratch, float* out,
                         MoeRoutingObserver* observer) const {
  const Moe& m = *moe_;
  kc::MoeRoutingParams routing = m.routing;
  routing.correction_bias = m.correction_bias.empty() ? nullptr : m.correction_bias.data();
  const int64_t E = routing.num_experts, top_k = routing.top_k;
  Grow(&scratch->router_logits, n * E);
  Grow(&scratch->expert_ids, n * top_k);
  Grow(&scratch->expert_weights, n * top_k);

  // Route: the whole router on every rank, so every rank chooses alike.
  k.gemm(ctx, x, n, m.router, nullptr, scratch->router_logits.data());
  k.moe_route(ctx, scratch->router_logits.data(), n, routing, scratch->expert_ids.data(),
              scratch->expert_weights.data());
  if (observer != nullptr) {
    observer->OnRouting(layer_, n, routing.top_k,
                        absl::MakeConstSpan(scratch->router_logits.data(), n * E),
                        absl::MakeConstSpan(scratch->expert_ids.data(), n * top_k),
                        absl::MakeConstSpan(scratch->expert_weights.data(), n * top_k));
  }

  // The routed experts this rank holds, combined with their weights in fp32.
  kc::MoeExpertsArgs args;
  args.x = x;
  args.num_tokens = n;
  args.hidden = hidden_;
  args.gate_up = m.gate_up;
  args.down = m.down;
  args.first_expert = m.first_expert;
  args.ids = scratch->expert_ids.data();
  args.weights = scratch->expert_weights.data();
  args.top_k = routing.top_k;
  args.out = out;
  k.moe_experts(ctx, args);

  // The shared experts see every token.
  if (!m.shared) return;
  Grow(&scratch->shared_out, n * hidden_);
  m.shared->Run(ctx, k, x, n, scratch, scratch->shared_out.data());
  for (int64_t i = 0; i < n * hidden_; ++i) out[i] += scratch->shared_out[i];
}

}  // namespace tessera::runner
