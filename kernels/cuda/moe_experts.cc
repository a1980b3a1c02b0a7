#include "kernels/cuda/moe_experts.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_grouping.h"
#include "kernels/cuda/moe_pair_gemv.h"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda {
namespace {

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Where the workspace's parts start.
struct WorkspaceLayout {
  size_t groups = 0, act = 0, y = 0, total = 0;
};

WorkspaceLayout Layout(int64_t max_tokens, int top_k, const MoeExpertWeights& w) {
  const size_t rows = static_cast<size_t>(max_tokens) * top_k;
  WorkspaceLayout l;
  l.act = Align256(sizeof(int32_t) * MoeGroupsInts(max_tokens, top_k, w.num_experts));
  l.y = l.act + Align256(rows * w.inter * sizeof(Bf16));
  l.total = l.y + Align256(rows * w.hidden * sizeof(Bf16));
  return l;
}

absl::Status CheckArgs(const MoeExpertsArgs& a) {
  if (absl::Status s = ValidateMoeExpertWeights(a.experts, "MoeExperts"); !s.ok()) return s;
  if (a.top_k < 1 || a.top_k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeExperts: top_k = ", a.top_k, " must be in [1, ", kMoeMaxTopK, "]"));
  }
  if (a.num_tokens < 0 || a.num_tokens > a.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExperts: num_tokens = ", a.num_tokens,
                                                   " outside [0, max_tokens = ", a.max_tokens,
                                                   "]"));
  }
  const size_t need = Layout(a.max_tokens, a.top_k, a.experts).total;
  if (a.workspace == nullptr || a.workspace_bytes < need ||
      reinterpret_cast<uintptr_t>(a.workspace) % 256 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExperts: workspace of ", a.workspace_bytes,
                                                   " bytes; needs ", need, ", 256-byte aligned"));
  }
  if (a.path == MoeExpertsPath::kGroupedGemm &&
      !MoeGroupedGemmSupports(a.experts.hidden, a.experts.inter)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeExperts: the grouped GEMM does not tile hidden ", a.experts.hidden,
                     " / inter ", a.experts.inter));
  }
  return absl::OkStatus();
}

absl::Status RunPairs(const MoeExpertsArgs& a, Bf16* act, CudaStream stream) {
  const MoePairGemvArgs p{a.x,       a.num_tokens, a.ids, a.weights, a.top_k, a.first_expert,
                          a.experts, a.shared,     act,   a.out};
  if (absl::Status s = MoePairGemvGateUp(p, stream); !s.ok()) return s;
  return MoePairGemvDownCombine(p, stream);
}

}  // namespace

size_t MoeExpertsWorkspaceBytes(int64_t max_tokens, int top_k, const MoeExpertWeights& experts) {
  return Layout(max_tokens, top_k, experts).total;
}

MoeExpertsPath MoeExpertsPathFor(int64_t num_tokens, const MoeExpertWeights& experts) {
  if (num_tokens <= kMoePairGemvMaxTokens) return MoeExpertsPath::kGemvPairs;
  if (num_tokens <= kMoeGemvMaxTokens || !MoeGroupedGemmSupports(experts.hidden, experts.inter)) {
    return MoeExpertsPath::kGemv;
  }
  return MoeExpertsPath::kGroupedGemm;
}

absl::Status MoeExperts(const MoeExpertsArgs& a, CudaStream stream) {
  if (absl::Status s = CheckArgs(a); !s.ok()) return s;
  if (a.num_tokens == 0) return absl::OkStatus();
  const WorkspaceLayout l = Layout(a.max_tokens, a.top_k, a.experts);
  char* base = static_cast<char*>(a.workspace);
  const MoeExpertsPath path =
      a.path == MoeExpertsPath::kAuto ? MoeExpertsPathFor(a.num_tokens, a.experts) : a.path;
  if (path == MoeExpertsPath::kGemvPairs)
    return RunPairs(a, reinterpret_cast<Bf16*>(base + l.act), stream);
  const MoeGroups g = CarveMoeGroups(reinterpret_cast<int32_t*>(base + l.groups), a.max_tokens,
                                     a.top_k, a.experts.num_experts);
  Bf16* act = reinterpret_cast<Bf16*>(base + l.act);
  Bf16* y = reinterpret_cast<Bf16*>(base + l.y);
  if (absl::Status s = MoeGroupByExpert(a.ids, a.num_tokens, a.first_expert, g, stream); !s.ok()) {
    return s;
  }
  absl::Status s;
  if (path == MoeExpertsPath::kGroupedGemm) {
    s = MoeGemmGateUp(a.x, a.num_tokens, a.experts, g, act, stream, a.gemm_kernel);
    if (s.ok()) s = MoeGemmDown(act, a.num_tokens, a.experts, g, y, stream, a.gemm_kernel);
  } else {
    s = MoeGemvGateUp(a.x, a.num_tokens, a.experts, g, act, stream);
    if (s.ok()) s = MoeGemvDown(act, a.num_tokens, a.experts, g, y, stream);
  }
  if (!s.ok()) return s;
  return MoeCombine(
      MoeCombineArgs{y, a.ids, a.weights, &g, a.shared, a.num_tokens, a.experts.hidden, a.out},
      stream);
}

}  // namespace tessera::kernels::cuda
