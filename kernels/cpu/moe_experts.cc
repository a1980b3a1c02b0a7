#include "kernels/cpu/moe_experts.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/reference_ops.h"

namespace tessera::kernels::cpu {
namespace {

int64_t Inter(const MoeExpertsArgs& a) { return a.down.empty() ? 0 : a.down[0].cols; }

// The local index of global expert `id`, or -1 when it is held elsewhere.
int64_t LocalExpert(const MoeExpertsArgs& a, int32_t id) {
  const int64_t local = int64_t{id} - a.first_expert;
  return local >= 0 && local < static_cast<int64_t>(a.gate_up.size()) ? local : -1;
}

// (token, weight) pairs per local expert, experts ascending and tokens
// ascending within one: the order both paths add the terms in.
struct ExpertBuckets {
  std::vector<int64_t> start;  // [experts + 1]
  std::vector<int64_t> token;
  std::vector<float> weight;
};

ExpertBuckets GroupByExpert(const MoeExpertsArgs& a) {
  const int64_t experts = static_cast<int64_t>(a.gate_up.size());
  ExpertBuckets b;
  b.start.assign(experts + 1, 0);
  for (int64_t i = 0; i < a.num_tokens * a.top_k; ++i) {
    if (int64_t e = LocalExpert(a, a.ids[i]); e >= 0) ++b.start[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) b.start[e + 1] += b.start[e];
  b.token.resize(b.start[experts]);
  b.weight.resize(b.start[experts]);
  std::vector<int64_t> fill(b.start.begin(), b.start.end() - 1);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int j = 0; j < a.top_k; ++j) {
      const int64_t e = LocalExpert(a, a.ids[t * a.top_k + j]);
      if (e < 0) continue;
      b.token[fill[e]] = t;
      b.weight[fill[e]++] = a.weights[t * a.top_k + j];
    }
  }
  return b;
}

// Rows of `y` [count, hidden] scaled by their weights into out's tokens.
void Combine(const ExpertBuckets& b, int64_t from, int64_t count, const float* y, int64_t hidden,
             float* out) {
  for (int64_t r = 0; r < count; ++r) {
    float* dst = out + b.token[from + r] * hidden;
    const float w = b.weight[from + r];
    const float* src = y + r * hidden;
    for (int64_t h = 0; h < hidden; ++h) dst[h] += w * src[h];
  }
}

}  // namespace

absl::Status ValidateMoeExperts(const MoeExpertsArgs& a) {
  if (a.gate_up.size() != a.down.size() || a.gate_up.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("moe experts: ", a.gate_up.size(),
                                                   " gate_up and ", a.down.size(),
                                                   " down matrices; need the same, >= 1"));
  }
  if (a.top_k < 1 || a.num_tokens < 0 || a.hidden < 1) {
    return absl::InvalidArgumentError(absl::StrCat("moe experts: top_k = ", a.top_k,
                                                   ", num_tokens = ", a.num_tokens,
                                                   ", hidden = ", a.hidden));
  }
  if (a.num_tokens > 0 && (!a.x || !a.ids || !a.weights || !a.out)) {
    return absl::InvalidArgumentError("moe experts: a buffer is null");
  }
  const int64_t inter = Inter(a);
  for (size_t e = 0; e < a.gate_up.size(); ++e) {
    const WeightMatrix& gu = a.gate_up[e];
    const WeightMatrix& d = a.down[e];
    if (gu.rows != 2 * inter || gu.cols != a.hidden || d.rows != a.hidden || d.cols != inter) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moe experts: expert ", a.first_expert + static_cast<int64_t>(e), " has gate_up [",
          gu.rows, ", ", gu.cols, "] and down [", d.rows, ", ", d.cols, "]; expected [", 2 * inter,
          ", ", a.hidden, "] and [", a.hidden, ", ", inter, "]"));
    }
  }
  return absl::OkStatus();
}

void MoeExperts(const CpuContext& ctx, const MoeExpertsArgs& a) {
  std::fill(a.out, a.out + a.num_tokens * a.hidden, 0.0f);
  const ExpertBuckets b = GroupByExpert(a);
  const int64_t inter = Inter(a);
  const int64_t most = a.num_tokens;  // an expert gets each token at most once
  std::vector<float> rows(most * a.hidden), gate_up(most * 2 * inter), act(most * inter),
      y(most * a.hidden);
  for (size_t e = 0; e < a.gate_up.size(); ++e) {
    const int64_t from = b.start[e], count = b.start[e + 1] - from;
    if (count == 0) continue;  // an expert nobody chose costs nothing
    for (int64_t r = 0; r < count; ++r) {
      std::memcpy(rows.data() + r * a.hidden, a.x + b.token[from + r] * a.hidden,
                  sizeof(float) * a.hidden);
    }
    Gemm(ctx, rows.data(), count, a.gate_up[e], nullptr, gate_up.data());
    SiluMul(ctx, gate_up.data(), count, inter, act.data());
    Gemm(ctx, act.data(), count, a.down[e], nullptr, y.data());
    Combine(b, from, count, y.data(), a.hidden, a.out);
  }
}

namespace reference {
void MoeExperts(const MoeExpertsArgs& a) {
  std::fill(a.out, a.out + a.num_tokens * a.hidden, 0.0f);
  const ExpertBuckets b = GroupByExpert(a);
  const int64_t inter = Inter(a);
  std::vector<float> gate_up(2 * inter), act(inter), y(a.hidden);
  // Token by token; the buckets give each token's experts in ascending order.
  std::vector<std::vector<std::pair<int64_t, float>>> per_token(a.num_tokens);
  for (size_t e = 0; e < a.gate_up.size(); ++e) {
    for (int64_t i = b.start[e]; i < b.start[e + 1]; ++i) {
      per_token[b.token[i]].push_back({static_cast<int64_t>(e), b.weight[i]});
    }
  }
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (const auto& [e, w] : per_token[t]) {
      reference::Gemm(a.x + t * a.hidden, 1, a.gate_up[e], nullptr, gate_up.data());
      reference::SiluMul(gate_up.data(), 1, inter, act.data());
      reference::Gemm(act.data(), 1, a.down[e], nullptr, y.data());
      float* dst = a.out + t * a.hidden;
      for (int64_t h = 0; h < a.hidden; ++h) dst[h] += w * y[h];
    }
  }
}
}  // namespace reference

}  // namespace tessera::kernels::cpu
