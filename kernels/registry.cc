#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::kernels {
namespace {

struct FamilyCandidates {
  std::string_view flag;
  std::vector<std::string_view> names;
};

// The candidates compiled into this build, per override flag.
const std::vector<FamilyCandidates>& Candidates() {
  static const auto* table = new std::vector<FamilyCandidates>{
      {"gemm_backend", {"cpu_reference", "cpu"}},
      {"attention_backend", {"cpu_reference", "cpu"}},
      {"norm_backend", {"cpu_reference", "cpu"}},
      {"sampling_backend", {"cpu_reference", "cpu"}},
  };
  return *table;
}

}  // namespace

const std::vector<BackendFlag>& BackendFlags() {
  static const auto* flags = new std::vector<BackendFlag>{
      {"gemm_backend", "matrix products (projections, MLP, LM head)"},
      {"attention_backend", "paged attention, prefill and decode"},
      {"norm_backend", "RMSNorm, RoPE, SiLU-mul and embedding"},
      {"sampling_backend", "logits processing and sampling"},
  };
  return *flags;
}

std::vector<std::string> KnownBackends(std::string_view flag) {
  for (const FamilyCandidates& f : Candidates()) {
    if (f.flag == flag) return std::vector<std::string>(f.names.begin(), f.names.end());
  }
  return {};
}

absl::Status ValidateBackendOverride(std::string_view flag, std::string_view name) {
  std::vector<std::string> known = KnownBackends(flag);
  if (known.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend flag --", std::string(flag)));
  }
  if (name == "auto" || std::find(known.begin(), known.end(), name) != known.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--", std::string(flag), "=", std::string(name),
                                                 ": unknown backend; valid choices: auto, ",
                                                 absl::StrJoin(known, ", ")));
}

}  // namespace tessera::kernels
