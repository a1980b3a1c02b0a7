// The prefill path of the MoE experts: grouped GEMMs over the experts'
// row groups (moe_grouping.h), our own bf16 tensor-core kernels (fp32
// accumulate), reading the groups' row offsets from device memory.
//
//   MoeGemmGateUp: act[r, n] = silu(bf16(x[tok(r)] . gate_e[n])) *
//                  bf16(x[tok(r)] . up_e[n])     (gate and up in one pass)
//   MoeGemmDown:   y[r, h] = bf16(act[r] . down_e[h])
// The same results as moe_gemv.h's (up to fp32 summation order).
//
// Why our own kernel: cuBLAS's grouped GEMM takes every group's m on the
// host, and the counts exist only on the device (reading them back would
// synchronise every step and break CUDA graphs). The grid is sized for the
// worst case (MoeMaxGemmTiles M tiles: every expert's last tile may be
// partial) and a CTA whose tile slot is past the step's tiles exits at its
// first instruction, so experts without tokens cost (almost) nothing.
// Tiles of 128 rows x 128 columns x 64 k, a 3-stage cp.async pipeline
// with swizzled shared memory. Two kernels share the tiles and loads: on
// SM 9.0 two warpgroups issue wgmma m64n128k16 from shared memory (the
// sm_90a image); elsewhere 8 warps of 64 x 32 use ldmatrix + mma.sync, one
// kernel for every other arch of the build (sm_80 .. sm_120). Gate/up
// tiles hold 64 gate rows and the matching 64 up rows, so the SiLU-mul
// runs in the epilogue and the 2I-wide product never reaches memory. Rows
// of a tile past its expert's end cost no tensor-core work (16-row blocks
// on mma.sync, 64-row halves on wgmma).
//
// Shapes: MoeGroupedGemmSupports (H % 128 == 0, I % 64 == 0); other shapes
// take the GEMV path.
//
// Thread-safety: enqueues on `stream`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_expert_weights.h"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {

bool MoeGroupedGemmSupports(int64_t hidden, int64_t inter);

// Which tensor-core instructions: kAuto = wgmma on SM 9.0, mma.sync
// elsewhere. kWgmma on another device is FAILED_PRECONDITION.
enum class MoeGemmKernelKind { kAuto, kMmaSync, kWgmma };

// x bf16 [num_tokens, H]; act bf16 [g.max_tokens * k, I].
absl::Status MoeGemmGateUp(const Bf16* x, int64_t num_tokens, const MoeExpertWeights& w,
                           const MoeGroups& g, Bf16* act, CudaStream stream,
                           MoeGemmKernelKind kernel = MoeGemmKernelKind::kAuto);

// act bf16 [rows, I] as MoeGemmGateUp wrote it; y bf16 [g.max_tokens * k, H].
absl::Status MoeGemmDown(const Bf16* act, int64_t num_tokens, const MoeExpertWeights& w,
                         const MoeGroups& g, Bf16* y, CudaStream stream,
                         MoeGemmKernelKind kernel = MoeGemmKernelKind::kAuto);

}  // namespace tessera::kernels::cuda
