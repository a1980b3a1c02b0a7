// Decode-path MoE GEMVs (moe_gemv.h). Each lane of a warp reads 16-byte
// slices of the weight row(s) at stride 256 elements and of the same slice
// of each of up to kRowsPerPass grouped rows (x or act: small, cached in
// L1/L2); the lane sums reduce with WarpSum. Weight loads are streaming
// (evict-first): each row is read once per pass.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/moe_gemv.h"

namespace tessera::kernels::cuda {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): this file's device helpers

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerPass = 8;
constexpr int kStride = 32 * 8;  // elements per warp step

// The expert of grid slot blockIdx.y and its grouped rows; false when the
// slot has no expert this step.
__device__ __forceinline__ bool SlotExpert(const MoeGroups& g, int* expert, int32_t* first_row,
                                           int32_t* rows) {
  if (static_cast<int>(blockIdx.y) >= g.active[0]) return false;
  *expert = g.active[1 + blockIdx.y];
  *first_row = g.offsets[*expert];
  *rows = g.offsets[*expert + 1] - *first_row;
  return true;
}

struct GateUpArgs {
  const Bf16* x;
  MoeExpertWeights w;
  MoeGroups g;
  Bf16* act;
};

__global__ void __launch_bounds__(kThreads) MoeGemvGateUpKernel(GateUpArgs a) {
  int expert;
  int32_t first_row, rows;
  if (!SlotExpert(a.g, &expert, &first_row, &rows)) return;
  const int64_t H = a.w.hidden, I = a.w.inter;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= I) return;
  const int lane = threadIdx.x & 31;
  const Bf16* gate = a.w.gate_up + (expert * 2 * I + n) * H;
  const Bf16* up = gate + I * H;
  for (int32_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
    const int count = min(kRowsPerPass, rows - r0);
    const Bf16* x[kRowsPerPass];
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      x[i] = a.x + a.g.row_token[first_row + r0 + min(i, count - 1)] * H;
    }
    float sg[kRowsPerPass] = {}, su[kRowsPerPass] = {};
#pragma unroll 2
    for (int64_t k = lane * 8; k < H; k += kStride) {
      float wg[8], wu[8];
      Unpack8(LoadWeight(gate + k), wg);
      Unpack8(LoadWeight(up + k), wu);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) {
        if (i >= count) break;
        float xv[8];
        Unpack8(LoadInput(x[i] + k), xv);
        sg[i] = Dot8(sg[i], wg, xv);
        su[i] = Dot8(su[i], wu, xv);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      if (i >= count) break;
      const float g = WarpSum(sg[i]), u = WarpSum(su[i]);
      if (lane == 0) {
        a.act[(first_row + r0 + i) * I + n] =
            FloatToBf16Bits(SiluTimes(RoundBf16(g), RoundBf16(u)));
      }
    }
  }
}

struct DownArgs {
  const Bf16* act;
  MoeExpertWeights w;
  MoeGroups g;
  Bf16* y;
};

__global__ void __launch_bounds__(kThreads) MoeGemvDownKernel(DownArgs a) {
  int expert;
  int32_t first_row, rows;
  if (!SlotExpert(a.g, &expert, &first_row, &rows)) return;
  const int64_t H = a.w.hidden, I = a.w.inter;
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (h >= H) return;
  const int lane = threadIdx.x & 31;
  const Bf16* down = a.w.down + (expert * H + h) * I;
  for (int32_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
    const int count = min(kRowsPerPass, rows - r0);
    const Bf16* act = a.act + (first_row + r0) * I;
    float s[kRowsPerPass] = {};
#pragma unroll 2
    for (int64_t k = lane * 8; k < I; k += kStride) {
      float wv[8];
      Unpack8(LoadWeight(down + k), wv);
#pragma unroll
      for (int i = 0; i < kRowsPerPass; ++i) {
        if (i >= count) break;
        float av[8];
        Unpack8(LoadInput(act + i * I + k), av);
        s[i] = Dot8(s[i], wv, av);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) {
      if (i >= count) break;
      const float v = WarpSum(s[i]);
      if (lane == 0) a.y[(first_row + r0 + i) * H + h] = FloatToBf16Bits(v);
    }
  }
}

dim3 Grid(int64_t columns, int64_t num_tokens, const MoeGroups& g) {
  const int64_t slots = MoeMaxActiveExperts(num_tokens, g.top_k, g.num_experts);
  return dim3(static_cast<unsigned>((columns + kWarps - 1) / kWarps), static_cast<unsigned>(slots));
}

// grid.y holds one slot per expert with rows: at most 65535.
absl::Status CheckSlots(int64_t num_tokens, const MoeGroups& g, absl::string_view what) {
  const int64_t slots = MoeMaxActiveExperts(num_tokens, g.top_k, g.num_experts);
  if (slots > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", slots, " expert slots exceed the grid's 65535"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeGemvGateUp(const Bf16* x, int64_t num_tokens, const MoeExpertWeights& w,
                           const MoeGroups& g, Bf16* act, CudaStream stream) {
  if (absl::Status s = ValidateMoeExpertStep("MoeGemvGateUp", w, g, num_tokens, x, act); !s.ok()) {
    return s;
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (absl::Status s = CheckSlots(num_tokens, g, "MoeGemvGateUp"); !s.ok()) return s;
  const GateUpArgs args{x, w, g, act};
  MoeGemvGateUpKernel<<<Grid(w.inter, num_tokens, g), kThreads, 0, AsCuda(stream)>>>(args);
  return CheckLastLaunch("MoeGemvGateUp");
}

absl::Status MoeGemvDown(const Bf16* act, int64_t num_tokens, const MoeExpertWeights& w,
                         const MoeGroups& g, Bf16* y, CudaStream stream) {
  if (absl::Status s = ValidateMoeExpertStep("MoeGemvDown", w, g, num_tokens, act, y); !s.ok()) {
    return s;
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (absl::Status s = CheckSlots(num_tokens, g, "MoeGemvDown"); !s.ok()) return s;
  const DownArgs args{act, w, g, y};
  MoeGemvDownKernel<<<Grid(w.hidden, num_tokens, g), kThreads, 0, AsCuda(stream)>>>(args);
  return CheckLastLaunch("MoeGemvDown");
}

}  // namespace tessera::kernels::cuda
