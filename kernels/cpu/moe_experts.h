// Mixture-of-experts expert MLPs (Op::kMoeExperts): every token through the
// experts its router chose, combined with the routing weights in fp32:
//   out[t] = sum over j < top_k with expert e = ids[t, j] held here of
//            weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))
// The terms of a token are added in ascending expert order, as
// transformers' expert loop does (so the sum, and therefore the output, is
// independent of the order the router listed them in and of the batch).
//
// The experts held here are a contiguous range of global ids [first_expert,
// first_expert + gate_up.size()): a token's choices outside it add nothing
// (expert parallelism: each rank holds whole experts; the ranks' partial
// outputs are then summed). With tensor parallelism every rank holds all
// experts, each sliced to inter / N rows of gate/up and columns of down, and
// the partial outputs are summed likewise.
//
// Reference: token by token, expert by expert, with the reference GEMM.
// Optimized (`cpu`): tokens grouped by expert (a counting sort, stable in
// token order), each expert's rows gathered and run as one GEMM + SiLU-mul +
// GEMM on the optimized kernels; experts that receive no token cost
// nothing. Because the optimized GEMM gives each row the same result for
// any number of rows, a token's output is bitwise independent of what it is
// batched with.
//
// Thread-safety: reentrant; the optimized entry uses the context's pool.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera::kernels::cpu {

struct MoeExpertsArgs {
  const float* x = nullptr;  // [num_tokens, hidden]
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  // Per expert held here: gate_up [2 * inter, hidden] (gate rows first, as
  // SiluMul reads them) and down [hidden, inter]. Same inter for every expert.
  absl::Span<const WeightMatrix> gate_up;
  absl::Span<const WeightMatrix> down;
  int32_t first_expert = 0;        // global id of gate_up[0]
  const int32_t* ids = nullptr;    // [num_tokens, top_k], global expert ids
  const float* weights = nullptr;  // [num_tokens, top_k]
  int top_k = 0;
  float* out = nullptr;  // [num_tokens, hidden], overwritten; must not overlap x
};

// OK when the shapes agree (every gate_up [2I, hidden], every down
// [hidden, I], as many of each, top_k >= 1, buffers set); otherwise
// INVALID_ARGUMENT naming the expert and the shape.
absl::Status ValidateMoeExperts(const MoeExpertsArgs& args);

// REQUIRES: ValidateMoeExperts(args) is OK.
void MoeExperts(const CpuContext& ctx, const MoeExpertsArgs& args);

namespace reference {
void MoeExperts(const MoeExpertsArgs& args);
}  // namespace reference

}  // namespace tessera::kernels::cpu
