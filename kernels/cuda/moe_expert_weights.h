// The expert weights the CUDA MoE kernels read: every expert held here
// stacked in one device tensor per projection, in transformers' [out, in]
// layout, bf16:
//   gate_up [E, 2I, H]: expert e's gate rows [0, I) then up rows [I, 2I)
//   down    [E, H, I]
// (E local experts, contiguous global ids from the call's first_expert;
// with tensor parallelism I is this rank's slice of the expert width.)
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {

struct MoeExpertWeights {
  const Bf16* gate_up = nullptr;
  const Bf16* down = nullptr;
  int num_experts = 0;
  int64_t hidden = 0;  // H
  int64_t inter = 0;   // I
};

// OK when every MoE expert kernel can read these weights: pointers set and
// 16-byte aligned, E >= 1, H and I positive multiples of 8 (16-byte rows).
inline absl::Status ValidateMoeExpertWeights(const MoeExpertWeights& w, absl::string_view what) {
  if (w.gate_up == nullptr || w.down == nullptr || w.num_experts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expert weights unset (", w.num_experts, " experts)"));
  }
  if (w.hidden <= 0 || w.inter <= 0 || w.hidden % 8 != 0 || w.inter % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": hidden ", w.hidden, " and inter ",
                                                   w.inter, " must be positive multiples of 8"));
  }
  if (reinterpret_cast<uintptr_t>(w.gate_up) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.down) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expert weights not 16-byte aligned"));
  }
  return absl::OkStatus();
}

// The checks of one expert-kernel call: valid weights, groups made for as
// many experts, num_tokens <= g.max_tokens, input and output set and
// 16-byte aligned.
inline absl::Status ValidateMoeExpertStep(absl::string_view what, const MoeExpertWeights& w,
                                          const MoeGroups& g, int64_t num_tokens, const void* in,
                                          const void* out) {
  if (absl::Status s = ValidateMoeExpertWeights(w, what); !s.ok()) return s;
  if (g.num_experts != w.num_experts || g.offsets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": groups of ", g.num_experts,
                                                   " experts for weights of ", w.num_experts));
  }
  if (num_tokens < 0 || num_tokens > g.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": num_tokens = ", num_tokens, " outside [0, ", g.max_tokens, "]"));
  }
  if (in == nullptr || out == nullptr || reinterpret_cast<uintptr_t>(in) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input/output unset or not 16-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels::cuda
