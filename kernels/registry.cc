#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda_backend.h"

namespace tessera::kernels {
namespace {

struct Family {
  std::string_view flag;
  std::string_view description;
  std::vector<Op> ops;
};

const std::vector<Family>& Families() {
  static const auto* families = new std::vector<Family>{
      {"gemm_backend", "matrix products (projections, MLP, LM head)", {Op::kGemm}},
      {"attention_backend",
       "paged attention, prefill and decode, and KV-cache writes",
       {Op::kAttentionPrefill, Op::kAttentionDecode, Op::kKvCacheWrite}},
      {"norm_backend",
       "RMSNorm, RoPE, SiLU-mul and embedding",
       {Op::kEmbedding, Op::kRmsNorm, Op::kRope, Op::kSiluMul}},
      {"sampling_backend",
       "logits processing and sampling",
       {Op::kLogitsProcessing, Op::kSampling}},
      {"all_reduce_backend", "the all-reduce between tensor-parallel ranks", {Op::kAllReduce}},
      {"moe_backend",
       "mixture-of-experts routing and expert MLPs",
       {Op::kMoeRouting, Op::kMoeExperts}},
      {"fp8_gemm_backend",
       "FP8 linears (block-scaled and compressed-tensors checkpoints)",
       {Op::kFp8Gemm}},
  };
  return *families;
}

const Family* FindFamily(std::string_view flag) {
  for (const Family& f : Families()) {
    if (f.flag == flag) return &f;
  }
  return nullptr;
}

std::string S(std::string_view v) { return std::string(v); }

}  // namespace

const std::vector<BackendFlag>& BackendFlags() {
  static const auto* flags = [] {
    auto* out = new std::vector<BackendFlag>;
    for (const Family& f : Families()) out->push_back({f.flag, f.description});
    return out;
  }();
  return *flags;
}

std::vector<Op> OpsOfFlag(std::string_view flag) {
  const Family* f = FindFamily(flag);
  return f == nullptr ? std::vector<Op>{} : f->ops;
}

std::string_view FlagOfOp(Op op) {
  for (const Family& f : Families()) {
    if (std::find(f.ops.begin(), f.ops.end(), op) != f.ops.end()) return f.flag;
  }
  return {};
}

std::vector<std::string> KnownBackends(std::string_view flag) {
  const Family* f = FindFamily(flag);
  if (f == nullptr) return {};
  const Registry& registry = BuiltinRegistry();
  std::vector<std::string> names;
  for (const Candidate* c : registry.CandidatesFor(f->ops.front())) {
    const bool everywhere = std::all_of(f->ops.begin(), f->ops.end(), [&](Op op) {
      for (const Candidate* other : registry.CandidatesFor(op)) {
        if (other->name == c->name) return true;
      }
      return false;
    });
    if (everywhere) names.push_back(c->name);
  }
  return names;
}

absl::Status ValidateBackendOverride(std::string_view flag, std::string_view name) {
  std::vector<std::string> known = KnownBackends(flag);
  if (known.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend flag --", S(flag)));
  }
  if (name == "auto" || std::find(known.begin(), known.end(), name) != known.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--", S(flag), "=", S(name),
                                                 ": unknown backend; valid choices: auto, ",
                                                 absl::StrJoin(known, ", ")));
}

absl::Status Registry::Add(Candidate candidate) {
  if (candidate.name.empty() || candidate.name == "auto") {
    return absl::InvalidArgumentError(absl::StrCat("invalid candidate name \"", candidate.name,
                                                   "\" for ", S(OpName(candidate.op))));
  }
  if (!candidate.why_not) {
    return absl::InvalidArgumentError(absl::StrCat("candidate ", candidate.name, " for ",
                                                   S(OpName(candidate.op)), " has no why_not"));
  }
  for (const Candidate& c : candidates_) {
    if (c.op == candidate.op && c.name == candidate.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "candidate ", candidate.name, " for ", S(OpName(candidate.op)), " is registered twice"));
    }
  }
  candidates_.push_back(std::move(candidate));
  return absl::OkStatus();
}

std::vector<const Candidate*> Registry::CandidatesFor(Op op) const {
  std::vector<const Candidate*> out;
  for (const Candidate& c : candidates_) {
    if (c.op == op) out.push_back(&c);
  }
  return out;
}

absl::StatusOr<Selection> Registry::Select(Op op, const DeviceDescription& device,
                                           std::string_view override_name,
                                           std::string_view flag) const {
  const std::vector<const Candidate*> candidates = CandidatesFor(op);
  const std::string op_name = S(OpName(op));
  const std::string label = flag.empty() ? absl::StrCat("backend ", S(override_name))
                                         : absl::StrCat("--", S(flag), "=", S(override_name));
  std::vector<std::optional<std::string>> reasons;
  for (const Candidate* c : candidates) reasons.push_back(c->why_not(device));

  auto describe_all = [&] {
    std::vector<std::string> parts;
    for (size_t i = 0; i < candidates.size(); ++i) {
      parts.push_back(absl::StrCat(candidates[i]->name, " (",
                                   reasons[i] ? *reasons[i] : std::string("ok"), ")"));
    }
    return parts.empty() ? std::string("none registered") : absl::StrJoin(parts, "; ");
  };

  int chosen = -1;
  std::string why;
  const bool automatic = override_name.empty() || override_name == "auto";
  if (automatic) {
    for (size_t i = 0; i < candidates.size() && chosen < 0; ++i) {
      if (!reasons[i]) chosen = static_cast<int>(i);
    }
    if (chosen < 0) {
      return absl::FailedPreconditionError(absl::StrCat("no backend can run ", op_name, " on ",
                                                        device.Summary(), ": ", describe_all()));
    }
    why = "auto: first eligible";
  } else {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i]->name == override_name) chosen = static_cast<int>(i);
    }
    if (chosen < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": no such backend for ", op_name, "; candidates: ", describe_all()));
    }
    if (reasons[chosen]) {
      return absl::InvalidArgumentError(absl::StrCat(label, " cannot run ", op_name, " on ",
                                                     device.Summary(), ": ", *reasons[chosen],
                                                     ". Candidates: ", describe_all()));
    }
    why = absl::StrCat("override ", label);
  }

  Selection selection;
  selection.op = op;
  selection.chosen = candidates[chosen]->name;
  if (candidates[chosen]->details) {
    absl::StrAppend(&why, "; ", candidates[chosen]->details(device));
  }
  selection.why = why;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (static_cast<int>(i) == chosen) continue;
    std::string reason;
    if (reasons[i]) {
      reason = *reasons[i];
    } else if (automatic) {
      reason = absl::StrCat("lower priority than ", selection.chosen);
    } else {
      reason = absl::StrCat("not requested (", label, ")");
    }
    selection.rejected.push_back({candidates[i]->name, reason});
  }
  return selection;
}

absl::StatusOr<SelectionReport> Registry::SelectAll(const DeviceDescription& device,
                                                    const BackendOverrides& overrides) const {
  std::vector<std::string> errors;
  for (const auto& [flag, name] : overrides) {
    if (FindFamily(flag) == nullptr) {
      errors.push_back(absl::StrCat("unknown backend flag --", flag));
    }
  }
  SelectionReport report;
  report.device = device.Summary();
  for (Op op : kAllOps) {
    const std::string_view flag = FlagOfOp(op);
    std::string_view name = "auto";
    if (!flag.empty()) {
      auto it = overrides.find(flag);
      if (it != overrides.end()) name = it->second;
    }
    absl::StatusOr<Selection> s = Select(op, device, name, flag);
    if (!s.ok()) {
      errors.push_back(std::string(s.status().message()));
      continue;
    }
    report.selections.push_back(*std::move(s));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel selection failed:\n  ", absl::StrJoin(errors, "\n  ")));
  }
  return report;
}

const Selection* SelectionReport::Find(Op op) const {
  for (const Selection& s : selections) {
    if (s.op == op) return &s;
  }
  return nullptr;
}

std::string SelectionReport::ToTable() const {
  std::vector<std::vector<std::string>> rows = {{"op", "chosen", "why", "rejected"}};
  for (const Selection& s : selections) {
    std::vector<std::string> rejected;
    for (const Rejection& r : s.rejected)
      rejected.push_back(absl::StrCat(r.name, " (", r.reason, ")"));
    rows.push_back({S(OpName(s.op)), s.chosen, s.why,
                    rejected.empty() ? std::string("-") : absl::StrJoin(rejected, "; ")});
  }
  size_t width[3] = {0, 0, 0};
  for (const auto& row : rows) {
    for (int c = 0; c < 3; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out = absl::StrCat("device: ", device, "\n");
  for (const auto& row : rows) {
    for (int c = 0; c < 3; ++c) {
      absl::StrAppend(&out, row[c], std::string(width[c] - row[c].size() + 2, ' '));
    }
    absl::StrAppend(&out, row[3], "\n");
  }
  return out;
}

const Registry& BuiltinRegistry() {
  static const Registry* registry = [] {
    auto* r = new Registry;
    // CUDA candidates first: on a CUDA device they are the only eligible
    // ones (the CPU candidates reject non-CPU devices); on a CPU they are
    // rejected with the reason, which `tessera doctor` shows.
    AddCudaCandidates(r);
    AddCpuCandidates(r);
    return r;
  }();
  return *registry;
}

}  // namespace tessera::kernels
