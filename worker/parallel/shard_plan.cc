#include "worker/parallel/shard_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::parallel {
namespace {

std::string RangeString(const Range& r) { return absl::StrCat("[", r.start, ", ", r.end(), ")"); }

// Slice `rank` of `n` items split as evenly as possible (the first n % size
// slices one item longer).
Range EvenSlice(int64_t n, int rank, int size) {
  const int64_t base = n / size, extra = n % size;
  Range r;
  r.start = rank * base + std::min<int64_t>(rank, extra);
  r.size = base + (rank < extra ? 1 : 0);
  return r;
}

bool HasDenseLayer(const model::ModelConfig& c) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsSparseLayer(l)) return true;
  }
  return false;
}

// The MoE split checks (see the header comment).
absl::Status CheckMoeParallel(const model::ModelConfig& c, int n, MoeParallelism moe,
                              const std::string& prefix) {
  const model::MoeConfig& m = *c.moe;
  if (moe == MoeParallelism::kTensor && m.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "--moe_parallel=tensor: the experts' moe_intermediate_size ", m.intermediate_size,
        " does not divide into ", n, " ranks; try --moe_parallel=expert"));
  }
  if (moe == MoeParallelism::kExpert && m.num_experts % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "--moe_parallel=expert: the model's ", m.num_experts,
        " routed experts do not divide into ", n, " ranks; try --moe_parallel=tensor"));
  }
  if (m.shared_intermediate_size() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "the shared experts' width ",
                                                   m.shared_intermediate_size(),
                                                   " does not divide into ", n, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view MoeParallelismName(MoeParallelism mode) {
  return mode == MoeParallelism::kExpert ? "expert" : "tensor";
}

absl::StatusOr<MoeParallelism> ParseMoeParallelism(std::string_view name) {
  if (name == "tensor") return MoeParallelism::kTensor;
  if (name == "expert") return MoeParallelism::kExpert;
  return absl::InvalidArgumentError(absl::StrCat("--moe_parallel=", std::string(name),
                                                 ": unknown mode; valid choices: tensor, expert"));
}

std::string ShardPlan::ToString() const {
  std::string out = absl::StrCat("rank ", rank, "/", size, ": q heads ", RangeString(q_heads),
                                 ", kv heads ", RangeString(kv_heads), ", intermediate ",
                                 RangeString(intermediate), ", vocab ", RangeString(vocab));
  if (experts.size > 0) {
    absl::StrAppend(&out, ", ", std::string(MoeParallelismName(moe_parallelism)),
                    "-parallel experts ", RangeString(experts), " of width ",
                    RangeString(expert_intermediate));
  }
  return out;
}

ShardPlan FullPlan(const model::ModelConfig& c) {
  ShardPlan p;
  p.q_heads = {0, c.num_attention_heads};
  p.kv_heads = {0, c.num_key_value_heads};
  p.intermediate = {0, c.intermediate_size};
  p.vocab = {0, c.vocab_size};
  if (c.moe) {
    p.experts = {0, c.moe->num_experts};
    p.expert_intermediate = {0, c.moe->intermediate_size};
    p.shared_intermediate = {0, c.moe->shared_intermediate_size()};
  }
  return p;
}

int64_t KvHeadsPerRank(const model::ModelConfig& c, int size) {
  if (size < 1) return c.num_key_value_heads;
  return c.num_key_value_heads >= size ? c.num_key_value_heads / size : 1;
}

absl::Status CheckTensorParallel(const model::ModelConfig& c, int n, MoeParallelism moe) {
  const std::string prefix = absl::StrCat("--tensor_parallel_size=", n, ": ");
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat(prefix, "must be >= 1"));
  if (n == 1) return absl::OkStatus();
  const int64_t heads = c.num_attention_heads, kv = c.num_key_value_heads;
  if (heads % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the model's ", heads, " attention heads do not divide into ", n,
                     " ranks; use a tensor-parallel size that divides ", heads));
  }
  if (kv >= n && kv % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "the model's ", kv, " key/value heads do not divide into ", n,
        " ranks; use a tensor-parallel size that divides ", kv, " or a multiple of it"));
  }
  if (kv < n && n % kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "the model has ", kv,
        " key/value heads, fewer than the ranks, so each must be "
        "replicated on an equal number of ranks, which needs the size to be a multiple of ",
        kv));
  }
  if (HasDenseLayer(c) && c.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "the model's intermediate_size ",
                                                   c.intermediate_size, " does not divide into ", n,
                                                   " ranks"));
  }
  if (c.vocab_size < n) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the vocabulary (", c.vocab_size, ") is smaller than the ranks"));
  }
  return c.moe ? CheckMoeParallel(c, n, moe, prefix) : absl::OkStatus();
}

absl::StatusOr<ShardPlan> PlanShard(const model::ModelConfig& c, int rank, int size,
                                    MoeParallelism moe) {
  if (auto s = CheckTensorParallel(c, size, moe); !s.ok()) return s;
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside a group of ", size));
  }
  if (size == 1) return FullPlan(c);
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  const int64_t heads_per_rank = c.num_attention_heads / size;
  p.q_heads = {rank * heads_per_rank, heads_per_rank};
  if (c.num_key_value_heads >= size) {
    const int64_t kv_per_rank = c.num_key_value_heads / size;
    p.kv_heads = {rank * kv_per_rank, kv_per_rank};
  } else {
    // The KV head of this rank's first query head; the others read the same
    // one because N / kv ranks share each group of queries_per_kv heads.
    p.kv_heads = {p.q_heads.start / c.queries_per_kv(), 1};
  }
  const int64_t inter_per_rank = c.intermediate_size / size;
  p.intermediate = {rank * inter_per_rank, inter_per_rank};
  p.vocab = EvenSlice(c.vocab_size, rank, size);
  p.add_row_bias = rank == 0;
  if (c.moe) {
    const model::MoeConfig& m = *c.moe;
    p.moe_parallelism = moe;
    const bool by_expert = moe == MoeParallelism::kExpert;
    const int64_t experts = by_expert ? m.num_experts / size : m.num_experts;
    const int64_t width = by_expert ? m.intermediate_size : m.intermediate_size / size;
    p.experts = {by_expert ? rank * experts : 0, experts};
    p.expert_intermediate = {by_expert ? 0 : rank * width, width};
    const int64_t shared = m.shared_intermediate_size() / size;
    p.shared_intermediate = {rank * shared, shared};
  }
  return p;
}

}  // namespace tessera::parallel
