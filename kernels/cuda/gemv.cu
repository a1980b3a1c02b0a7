// Skinny bf16 GEMM on tensor cores (see gemv.h).
//
// Tile: a CTA of 4 warps owns 16 rows of W (16 output features) and one
// split of k. k is walked in steps of 32 values; step t of a row is read
// by the 4 lanes of a quad as four 16-byte chunks (lane q of the quad reads
// values 32t + 8q .. 32t + 8q + 7). A lane with group id g (lane / 4) reads
// W rows g and g + 8 of the tile and activation row g (zero for g >= m).
//
// The dot product does not care in which order k is summed, so the 8
// values a lane holds are fed to two m16n8k16 MMAs under a fixed
// permutation of k that is the same for A (W) and B (x): for MMA 0 the
// logical k pair {2q, 2q+1} is physical chunk values {0, 1} and the pair
// {2q+8, 2q+9} is values {2, 3}; MMA 1 takes values {4, 5} and {6, 7}. With
// A = W rows (row g: registers 0 and 2; row g + 8: registers 1 and 3) and
// B = x rows as the 8 columns, the 16-byte chunks go into the MMAs
// without any shuffle. The accumulator element (row r, column c) is
// output feature n0 + r of activation row c.
//
// Each warp takes 4 consecutive steps (4 KiB of W) per iteration and
// issues the next iteration's loads before this one's MMAs; the 4 warps
// cover 16 consecutive steps (512 values, 1 KiB per row), and the warps'
// accumulators are summed in shared memory in warp order. With more than
// one split, each CTA stores its 16 x m partial sums in the workspace,
// and the CTA that arrives last at the tile's counter sums the splits in
// split order, adds the bias, writes y and resets the counter.
#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/mbarrier.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;
constexpr int kStepK = 32;
constexpr int kUnroll = 4;
constexpr int kStepsPerIter = kWarps * kUnroll;

__device__ __forceinline__ float RoundBf16(float v) { return Bf16BitsToFloat(FloatToBf16Bits(v)); }

// Predicated 16-byte loads (zeros when !pred). Volatile so that ptxas
// keeps every load of an iteration ahead of its MMAs. W is read exactly
// once: bypass L1 and ask L2 for 256-byte fetches; x is shared by all CTAs
// and stays in L1.
__device__ __forceinline__ uint4 LoadStreaming(const uint16_t* p, bool pred) {
  uint4 r;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return r;
}

__device__ __forceinline__ uint4 LoadCached(const uint16_t* p, bool pred) {
  uint4 r;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return r;
}

__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// What the kernel does with a tile's sums.
enum class Out { kBf16, kF32, kQkvRope, kSiluMul };

// kQkvRope: RoPE and the KV-cache write on the tile (see GemvQkvRope).
struct RopeArgs {
  int head_dim, q_rows, k_rows;
  const int32_t* positions;
  const float* inv_freq;
  const int64_t* slots;
  int64_t num_slots;
  uint16_t* k_cache;
  uint16_t* v_cache;
};

// Stores value (row, col) of a finished tile of kTile rows starting at
// output feature n0 (fin: the tile's sums, [row][activation row]) for
// kQkvRope. The q/k rows of a head are in RoPE order (GemvRopeRow): every
// 8 rows hold features i .. i + 3 and their partners i + half .. i + half
// + 3, four rows apart, so the rotation pairs meet in the tile. Both
// values are rounded to bf16 first, as the unfused GEMV stores them, then
// rotated as RopeKernel does.
template <int kTile>
__device__ __forceinline__ void StoreQkvRope(const float (&fin)[kTile][8], int row, int col, int n0,
                                             int m, int n, uint16_t* y, const RopeArgs& rope) {
  if (col >= m) return;
  uint16_t* out = y + static_cast<int64_t>(col) * n;
  const int64_t slot = rope.slots != nullptr ? rope.slots[col] : -1;
  const bool store = slot >= 0 && slot < rope.num_slots;
  const int64_t kv_row = slot * rope.k_rows;
  const int rotated = rope.q_rows + rope.k_rows;
  const int out_n = n0 + row;
  if (n0 < rotated) {
    if (row & 4) return;  // the partner of row - 4
    const int head_base = n0 / rope.head_dim * rope.head_dim;
    const int half = rope.head_dim / 2;
    const int i = (n0 - head_base) / 2 + (row >> 3) * 4 + (row & 3);
    const float a = RoundBf16(fin[row][col]);
    const float b2 = RoundBf16(fin[row + 4][col]);
    uint16_t lo, hi;
    RopeRotate(a, b2, static_cast<float>(rope.positions[col]), rope.inv_freq[i], &lo, &hi);
    out[head_base + i] = lo;
    out[head_base + i + half] = hi;
    if (head_base >= rope.q_rows && store) {
      uint16_t* d = rope.k_cache + kv_row + (head_base - rope.q_rows);
      d[i] = lo;
      d[i + half] = hi;
    }
  } else if (out_n < n) {
    const uint16_t val = FloatToBf16Bits(fin[row][col]);
    out[out_n] = val;
    if (store) rope.v_cache[kv_row + (out_n - rotated)] = val;
  }
}

template <Out kOut>
__global__ void __launch_bounds__(kThreads)
    GemvKernel(const uint16_t* __restrict__ x, int m, int k, const uint16_t* __restrict__ w, int n,
               const float* __restrict__ bias, void* __restrict__ y, int steps_per_split,
               int splits, float* __restrict__ partials, uint32_t* __restrict__ counters,
               const RopeArgs rope) {
  // A programmatic dependent (the p2p all-reduce + RMSNorm, FusedAddRmsNorm)
  // may launch now: it loads what does not depend on this kernel, then
  // waits for it.
  AllowDependentLaunch();
  __shared__ float red[kWarps][kTileRows][8];
  __shared__ uint32_t is_last;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int tile = blockIdx.x;
  const int split = blockIdx.y;
  const int n0 = tile * kTileRows;
  const int total_steps = (k + kStepK - 1) / kStepK;
  const int s_begin = split * steps_per_split;
  const int s_end = min(total_steps, s_begin + steps_per_split);

  const bool lo_ok = n0 + g < n;
  const bool hi_ok = n0 + g + 8 < n;
  const bool x_ok = g < m;
  const uint16_t* w_lo = w + static_cast<int64_t>(lo_ok ? n0 + g : 0) * k + q * 8;
  const uint16_t* w_hi = w + static_cast<int64_t>(hi_ok ? n0 + g + 8 : 0) * k + q * 8;
  const uint16_t* xr = x + static_cast<int64_t>(x_ok ? g : 0) * k + q * 8;
  const int k_lane = k - q * 8;  // chunk at step t is inside k iff 32 t < k_lane

  // Loads the warp's 4 steps of the iteration starting at step `it`
  // (zeros past the split, k, n or m).
  auto load = [&](int it, uint4(&lo)[kUnroll], uint4(&hi)[kUnroll], uint4(&xb)[kUnroll]) {
    const int base = it + warp * kUnroll;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int step = base + u;
      const int kk = step * kStepK;
      const bool ok = step < s_end && kk < k_lane;
      lo[u] = LoadStreaming(w_lo + kk, ok && lo_ok);
      hi[u] = LoadStreaming(w_hi + kk, ok && hi_ok);
      xb[u] = LoadCached(xr + kk, ok && x_ok);
    }
  };

  // Software pipeline: the next iteration's loads are issued before this
  // iteration's MMAs, so up to 8 KiB of W per warp are in flight.
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 a_lo[kUnroll], a_hi[kUnroll], b[kUnroll];
  load(s_begin, a_lo, a_hi, b);
  for (int it = s_begin; it < s_end; it += kStepsPerIter) {
    uint4 n_lo[kUnroll], n_hi[kUnroll], n_b[kUnroll];
    load(it + kStepsPerIter, n_lo, n_hi, n_b);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      MmaBf16(acc, a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y, b[u].x, b[u].y);
      MmaBf16(acc, a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w, b[u].z, b[u].w);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      a_lo[u] = n_lo[u];
      a_hi[u] = n_hi[u];
      b[u] = n_b[u];
    }
  }

  red[warp][g][2 * q] = acc[0];
  red[warp][g][2 * q + 1] = acc[1];
  red[warp][g + 8][2 * q] = acc[2];
  red[warp][g + 8][2 * q + 1] = acc[3];
  __syncthreads();
  const int row = threadIdx.x >> 3;  // 0..15
  const int col = threadIdx.x & 7;   // activation row
  float v = red[0][row][col];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) v += red[i][row][col];
  const int out_n = n0 + row;
  const bool valid = col < m && out_n < n;
  const int64_t out_i = static_cast<int64_t>(col) * n + out_n;
  if (splits > 1) {
    if (valid) partials[static_cast<int64_t>(split) * m * n + out_i] = v;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t prev = atomicAdd(&counters[tile], 1u);
      is_last = prev == static_cast<uint32_t>(splits - 1) ? 1u : 0u;
    }
    __syncthreads();
    if (is_last == 0) return;  // uniform over the CTA
    __threadfence();
    if (valid) {
      v = __ldcg(&partials[out_i]);
      for (int s = 1; s < splits; ++s)
        v += __ldcg(&partials[static_cast<int64_t>(s) * m * n + out_i]);
    }
    if (threadIdx.x == 0) counters[tile] = 0;
  }
  if (valid && bias != nullptr) v += bias[out_n];

  if constexpr (kOut == Out::kF32) {
    if (valid) static_cast<float*>(y)[out_i] = v;
  } else if constexpr (kOut == Out::kBf16) {
    if (valid) static_cast<uint16_t*>(y)[out_i] = FloatToBf16Bits(v);
  } else {
    __shared__ float fin[kTileRows][8];
    fin[row][col] = v;
    __syncthreads();
    StoreQkvRope<kTileRows>(fin, row, col, n0, m, n, static_cast<uint16_t*>(y), rope);
  }
}

// The staged form (SM 9.0+, see GemvStagedBf16): a CTA of 4 warps owns 8
// rows of W and all of k. Thread 0 copies the 8 rows into shared memory
// with bulk copies that complete on an mbarrier, before the CTA waits for
// the kernel it depends on (griddepcontrol.wait, which returns at once
// when the launch is not programmatic); only then does it copy the m rows
// of x the same way. Here the W rows are the MMA's B operand (its n = 8
// columns) and the <= 8 x rows its A operand (rows 8..15 zero), under the
// same k permutation as above: lane (g, q) reads 16 bytes of W row g and
// of x row g at k offset 32 t + 8 q, from rows padded by 64 bytes so that
// the 8 lanes of each quarter-warp hit distinct banks. Warp w takes steps
// [w k / 128, (w + 1) k / 128) with two accumulators; the warps' sums are
// added in warp order.
constexpr int kStagedRows = 8;
constexpr int kStagedPad = 64;  // bytes after each staged row: conflict-free 16-byte reads
constexpr uint64_t kStagedTimeoutNs = 4000000000ull;

template <Out kOut>
__global__ void __launch_bounds__(kThreads)
    StagedGemvKernel(const uint16_t* x, int m, int k, const uint16_t* __restrict__ w, int n,
                     const float* __restrict__ bias, uint16_t* __restrict__ y,
                     const RopeArgs rope) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  AllowDependentLaunch();  // as GemvKernel
  extern __shared__ __align__(128) unsigned char staged[];
  __shared__ __align__(8) uint64_t bar[2];  // W landed, x landed
  __shared__ float red[kWarps][8][kStagedRows];
  __shared__ float fin[kStagedRows][8];
  const int n0 = blockIdx.x * kStagedRows;
  const int row_bytes = k * 2;
  const int stride = row_bytes + kStagedPad;
  unsigned char* xs = staged + kStagedRows * stride;  // m rows of x, same stride
  const uint32_t w_bar = SharedAddress(&bar[0]);
  const uint32_t x_bar = SharedAddress(&bar[1]);
  auto copy_rows = [&](unsigned char* dst, const uint16_t* src, int rows, uint32_t b) {
    MbarArriveExpectTx(b, static_cast<uint32_t>(row_bytes * rows));
    for (int r = 0; r < rows; ++r) {
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];\n" ::"r"(SharedAddress(dst + r * stride)),
          "l"(src + static_cast<int64_t>(r) * k), "r"(row_bytes), "r"(b)
          : "memory");
    }
  };
  if (threadIdx.x == 0) {
    MbarInit(w_bar, 1);
    MbarInit(x_bar, 1);
    MbarFenceInit();
    copy_rows(staged, w + static_cast<int64_t>(n0) * k, kStagedRows, w_bar);
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them
  WaitForPrimary();
  // x, which the kernel before this one writes, is copied only now, by the
  // bulk-copy unit as well (through L2; one request per row instead of a
  // load per lane and step).
  if (threadIdx.x == 0) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    copy_rows(xs, x, m, x_bar);
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int per_warp = k / (32 * kWarps);
  const int s0 = warp * per_warp;
  const bool x_ok = g < m;
  const unsigned char* wr = staged + g * stride + q * 16 + s0 * 64;
  const unsigned char* xr = xs + (x_ok ? g : 0) * stride + q * 16 + s0 * 64;
  // A copy that never lands ends the kernel (with wrong sums) after 4 s
  // instead of hanging the stream.
  bool timed_out = false;
  MbarWait(w_bar, 0, kStagedTimeoutNs, timed_out);
  MbarWait(x_bar, 0, kStagedTimeoutNs, timed_out);
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
  for (int i = 0; i < per_warp; ++i) {
    const uint4 wv = *reinterpret_cast<const uint4*>(wr + i * 64);
    uint4 xv = *reinterpret_cast<const uint4*>(xr + i * 64);
    if (!x_ok) xv = make_uint4(0, 0, 0, 0);
    MmaBf16(acc0, xv.x, 0u, xv.y, 0u, wv.x, wv.y);
    MmaBf16(acc1, xv.z, 0u, xv.w, 0u, wv.z, wv.w);
  }
  // acc[0], acc[1]: x row g, W rows 2q and 2q + 1 (acc[2], acc[3]: the zero rows).
  red[warp][g][2 * q] = acc0[0] + acc1[0];
  red[warp][g][2 * q + 1] = acc0[1] + acc1[1];
  __syncthreads();
  if (threadIdx.x >= 64) return;
  const int col = threadIdx.x >> 3;  // activation row
  const int row = threadIdx.x & 7;   // W row of the tile
  float v = red[0][col][row];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) v += red[i][col][row];
  const int out_n = n0 + row;
  if (bias != nullptr) v += bias[out_n];
  if constexpr (kOut == Out::kBf16) {
    if (col < m) y[static_cast<int64_t>(col) * n + out_n] = FloatToBf16Bits(v);
  } else if constexpr (kOut == Out::kSiluMul) {
    // Rows 0..3: gate j0 .. j0 + 3; rows 4..7 their up rows (GemvGateUpRow).
    // Both rounded to bf16 as the GEMV stores them, then as SiluMul does.
    fin[row][col] = v;
    asm volatile("bar.sync 1, 64;\n" ::: "memory");  // the 64 threads left
    if (row < 4 && col < m) {
      const float g = RoundBf16(fin[row][col]), u = RoundBf16(fin[row + 4][col]);
      y[static_cast<int64_t>(col) * (n / 2) + n0 / 2 + row] = FloatToBf16Bits(SiluTimes(g, u));
    }
  } else {
    fin[row][col] = v;
    asm volatile("bar.sync 1, 64;\n" ::: "memory");  // the 64 threads left
    StoreQkvRope<kStagedRows>(fin, row, col, n0, m, n, y, rope);
  }
#endif
}

// The 8 W rows and the m x rows.
int StagedSmemBytes(int64_t m, int64_t k) {
  return static_cast<int>((kStagedRows + m) * (2 * k + kStagedPad));
}

struct SplitPlan {
  int splits = 1;
  int steps_per_split = 1;
};

SplitPlan PlanSplits(int64_t m, int64_t n, int64_t k, const GemvWorkspace& ws, int force_splits) {
  const int64_t total_steps = (k + kStepK - 1) / kStepK;
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  int64_t splits = 1;
  if (force_splits > 0) {
    splits = force_splits;
  } else {
    // With at least one row tile per SM, no split: on the H200 one split
    // beat two or more on every Llama-3-8B shape (cuda_ops_bench's split
    // sweep: 4096x4096 12.5 vs 12.9 us, 6144x4096 15.4 vs 19.4, 4096x14336
    // 32.8 vs 33.4, 28672x4096 60.5 vs 62.6). Fewer tiles than SMs: fill
    // the resident slots in one wave (a second, partial wave of equal CTAs
    // would run the tail at a fraction of the bandwidth).
    const int64_t sms = ws.num_sms > 0 ? ws.num_sms : 132;
    const int64_t slots = sms * (ws.ctas_per_sm > 0 ? ws.ctas_per_sm : 4);
    if (tiles < sms) splits = std::max<int64_t>(1, slots / tiles);
  }
  splits = std::min<int64_t>({splits, total_steps, 65535});
  if (splits > 1) {
    if (ws.partials == nullptr || ws.counters == nullptr || tiles > ws.counter_capacity) {
      splits = 1;
    } else {
      splits = std::min<int64_t>(splits, ws.partial_capacity / (m * n));
    }
  }
  SplitPlan plan;
  if (splits <= 1) {
    plan.splits = 1;
    plan.steps_per_split = static_cast<int>(total_steps);
    return plan;
  }
  int64_t sps = (total_steps + splits - 1) / splits;
  // Whole CTA iterations per split, so no warp of a split idles.
  if (force_splits <= 0) sps = (sps + kStepsPerIter - 1) / kStepsPerIter * kStepsPerIter;
  plan.steps_per_split = static_cast<int>(sps);
  plan.splits = static_cast<int>((total_steps + sps - 1) / sps);
  return plan;
}

absl::Status Launch(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                    const float* bias, void* y, Out out, const RopeArgs& rope,
                    const GemvWorkspace& ws, CudaStream stream, int force_splits) {
  if (!GemvApplicable(x, m, k, w)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvBf16: needs 1 <= m <= ", kGemvMaxRows,
                     ", k % 8 == 0 and 16-byte aligned x and W (m=", m, " k=", k, ")"));
  }
  if (n <= 0 || n > INT32_MAX || k > (INT32_MAX >> 1)) {
    return absl::InvalidArgumentError(absl::StrCat("GemvBf16: bad shape n=", n, " k=", k));
  }
  if (y == nullptr) return absl::InvalidArgumentError("GemvBf16: null output");
  const SplitPlan plan = PlanSplits(m, n, k, ws, force_splits);
  const dim3 grid(static_cast<unsigned>((n + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>(plan.splits));
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const cudaStream_t s = AsCuda(stream);
  switch (out) {
    case Out::kF32:
      GemvKernel<Out::kF32><<<grid, kThreads, 0, s>>>(x, mi, ki, w, ni, bias, y,
                                                      plan.steps_per_split, plan.splits,
                                                      ws.partials, ws.counters, rope);
      break;
    case Out::kBf16:
      GemvKernel<Out::kBf16><<<grid, kThreads, 0, s>>>(x, mi, ki, w, ni, bias, y,
                                                       plan.steps_per_split, plan.splits,
                                                       ws.partials, ws.counters, rope);
      break;
    case Out::kQkvRope:
      GemvKernel<Out::kQkvRope><<<grid, kThreads, 0, s>>>(x, mi, ki, w, ni, bias, y,
                                                          plan.steps_per_split, plan.splits,
                                                          ws.partials, ws.counters, rope);
      break;
    case Out::kSiluMul:  // the staged kernel's epilogue only
      return absl::InvalidArgumentError("GemvBf16: no SiLU-mul epilogue in the tiled GEMV");
  }
  return CheckLastLaunch("GemvBf16");
}

// The staged kernels' per-device set-up, done once per device: whether
// the device runs an SM 9.0+ image of them, and their dynamic shared-memory
// limit raised to what the largest staged shape needs (capped by the
// device's per-block limit), so that launches do no host work beyond the
// launch itself.
constexpr int kStagedMaxSmem =
    static_cast<int>((kStagedRows + kGemvMaxRows) * (2 * kStagedMaxK + kStagedPad));

struct StagedDevice {
  bool supported = false;
  int max_smem = 0;     // the raised limit (bytes); launches needing more are refused
  absl::Status status;  // of raising it
};

// Raises kernel kOut's dynamic shared-memory limit to `bytes`.
template <Out kOut>
absl::Status RaiseStagedSmemLimit(int bytes) {
  return CudaError(cudaFuncSetAttribute(StagedGemvKernel<kOut>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                   "staged GEMV: shared-memory limit");
}

// The largest static shared memory of the staged kernels.
absl::Status StagedStaticSmem(int* bytes) {
  *bytes = 0;
  for (const void* f : {reinterpret_cast<const void*>(StagedGemvKernel<Out::kBf16>),
                        reinterpret_cast<const void*>(StagedGemvKernel<Out::kSiluMul>),
                        reinterpret_cast<const void*>(StagedGemvKernel<Out::kQkvRope>)}) {
    cudaFuncAttributes attr{};
    TESSERA_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, f));
    *bytes = std::max(*bytes, static_cast<int>(attr.sharedSizeBytes));
  }
  return absl::OkStatus();
}

// Sets d up for device `dev` (the current device).
void PrepareStagedDevice(StagedDevice& d, int dev) {
  // The image of the kernel this device runs must have been compiled for
  // SM 9.0+ (its body is empty below that): a build that reaches a Hopper
  // GPU only through older PTX has no staged GEMV. Such an image also
  // means the device takes programmatic dependent launches.
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, StagedGemvKernel<Out::kBf16>) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  d.supported = attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
  if (!d.supported) return;
  int optin = 0, static_smem = 0;
  d.status.Update(
      CudaError(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                "staged GEMV: shared-memory limit"));
  d.status.Update(StagedStaticSmem(&static_smem));
  // Static and dynamic shared memory count against the same per-block limit.
  const int limit = std::min(kStagedMaxSmem, optin - static_smem);
  if (!d.status.ok() || limit <= 0) return;
  d.status.Update(RaiseStagedSmemLimit<Out::kBf16>(limit));
  d.status.Update(RaiseStagedSmemLimit<Out::kSiluMul>(limit));
  d.status.Update(RaiseStagedSmemLimit<Out::kQkvRope>(limit));
  if (d.status.ok()) d.max_smem = limit;
}

absl::StatusOr<const StagedDevice*> PreparedStagedDevice() {
  static PerDevice<StagedDevice> devices;
  cudaError_t err = cudaSuccess;
  const StagedDevice* d = devices.Current(PrepareStagedDevice, &err);
  if (d != nullptr) return d;
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("staged GEMV: no usable CUDA device (", cudaGetErrorName(err), ")"));
  }
  return absl::InternalError(absl::StrCat("staged GEMV: device ordinal out of range (at most ",
                                          PerDevice<StagedDevice>::kMaxDevices, " devices)"));
}

absl::Status LaunchStaged(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                          const float* bias, Bf16* y, Out out, const RopeArgs& rope,
                          CudaStream stream) {
  if (!GemvStagedApplicable(x, m, n, k, w)) {
    return absl::InvalidArgumentError(absl::StrCat("GemvStagedBf16: needs 1 <= m <= ", kGemvMaxRows,
                                                   ", n % 8 == 0, k % 128 == 0, k <= ", kStagedMaxK,
                                                   " and 16-byte aligned x and W (m=", m, " n=", n,
                                                   " k=", k, ")"));
  }
  if (y == nullptr) return absl::InvalidArgumentError("GemvStagedBf16: null output");
  absl::StatusOr<const StagedDevice*> dev = PreparedStagedDevice();
  if (!dev.ok()) return dev.status();
  if (!(*dev)->supported) {
    return absl::FailedPreconditionError(
        "GemvStagedBf16: needs a device of SM 9.0 or newer and a build with an image for it");
  }
  if (!(*dev)->status.ok()) return (*dev)->status;
  const int smem = StagedSmemBytes(m, k);
  if (smem > (*dev)->max_smem) {
    return absl::InvalidArgumentError(absl::StrCat("GemvStagedBf16: m=", m, " k=", k, " needs ",
                                                   smem,
                                                   " bytes of shared memory per CTA; the "
                                                   "device allows ",
                                                   (*dev)->max_smem));
  }
  const auto* xs = reinterpret_cast<const uint16_t*>(x);
  const auto* ws = reinterpret_cast<const uint16_t*>(w);
  auto* ys = reinterpret_cast<uint16_t*>(y);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const dim3 grid(static_cast<unsigned>(n / kStagedRows));
  const cudaStream_t s = AsCuda(stream);
  if (out == Out::kQkvRope) {
    TESSERA_CUDA_RETURN_IF_ERROR(LaunchDependentIf(true, StagedGemvKernel<Out::kQkvRope>, grid,
                                                   kThreads, smem, s, xs, mi, ki, ws, ni, bias, ys,
                                                   rope));
  } else if (out == Out::kSiluMul) {
    TESSERA_CUDA_RETURN_IF_ERROR(LaunchDependentIf(true, StagedGemvKernel<Out::kSiluMul>, grid,
                                                   kThreads, smem, s, xs, mi, ki, ws, ni, bias, ys,
                                                   rope));
  } else {
    TESSERA_CUDA_RETURN_IF_ERROR(LaunchDependentIf(true, StagedGemvKernel<Out::kBf16>, grid,
                                                   kThreads, smem, s, xs, mi, ki, ws, ni, bias, ys,
                                                   rope));
  }
  return CheckLastLaunch("GemvStagedBf16");
}

}  // namespace

bool GemvStagedSupported() {
  absl::StatusOr<const StagedDevice*> dev = PreparedStagedDevice();
  return dev.ok() && (*dev)->supported && (*dev)->status.ok();
}

absl::Status GemvStagedResidentCtasPerSm(int64_t m, int64_t k, int* ctas) {
  *ctas = 0;
  if (m < 1 || m > kGemvMaxRows || k <= 0 || k > kStagedMaxK) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvStagedResidentCtasPerSm: bad shape m=", m, " k=", k));
  }
  absl::StatusOr<const StagedDevice*> dev = PreparedStagedDevice();
  if (!dev.ok()) return dev.status();
  if (!(*dev)->status.ok()) return (*dev)->status;
  const int smem = StagedSmemBytes(m, k);
  if (!(*dev)->supported || smem > (*dev)->max_smem) return absl::OkStatus();  // none
  TESSERA_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      ctas, StagedGemvKernel<Out::kBf16>, kThreads, static_cast<size_t>(smem)));
  return absl::OkStatus();
}

bool GemvStagedApplicable(const Bf16* x, int64_t m, int64_t n, int64_t k, const Bf16* w) {
  return GemvApplicable(x, m, k, w) && n > 0 && n % kStagedRows == 0 && n <= INT32_MAX &&
         k % 128 == 0 && k <= kStagedMaxK;
}

absl::Status GemvStagedBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                            const float* bias, Bf16* y, CudaStream stream) {
  return LaunchStaged(x, m, k, w, n, bias, y, Out::kBf16, RopeArgs{}, stream);
}

int64_t GemvGateUpRow(int64_t r, int64_t inter) {
  const int64_t j = r < inter ? r : r - inter;
  return (j / 4) * 8 + (r < inter ? 0 : 4) + j % 4;
}

absl::Status GemvStagedGateUpSiluBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w_gate_up,
                                      int64_t inter, const float* bias, Bf16* act,
                                      CudaStream stream) {
  if (inter <= 0 || inter % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvStagedGateUpSiluBf16: needs inter % 4 == 0 (inter=", inter, ")"));
  }
  return LaunchStaged(x, m, k, w_gate_up, 2 * inter, bias, act, Out::kSiluMul, RopeArgs{}, stream);
}

absl::Status GemvResidentCtasPerSm(int* ctas) {
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas, GemvKernel<Out::kBf16>, kThreads, 0));
  return absl::OkStatus();
}

bool GemvApplicable(const Bf16* x, int64_t m, int64_t k, const Bf16* w) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % 8 == 0 && x != nullptr && w != nullptr &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

int GemvSplits(int64_t m, int64_t n, int64_t k, const GemvWorkspace& ws, int force_splits) {
  if (m <= 0 || n <= 0 || k <= 0) return 1;
  return PlanSplits(m, n, k, ws, force_splits).splits;
}

absl::Status GemvBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                      const float* bias, Bf16* y, const GemvWorkspace& ws, CudaStream stream,
                      int force_splits) {
  return Launch(x, m, k, w, n, bias, y, Out::kBf16, RopeArgs{}, ws, stream, force_splits);
}

absl::Status GemvBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w, int64_t n,
                      const float* bias, float* y, const GemvWorkspace& ws, CudaStream stream,
                      int force_splits) {
  return Launch(x, m, k, w, n, bias, y, Out::kF32, RopeArgs{}, ws, stream, force_splits);
}

int64_t GemvRopeRow(int64_t f, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  return f < half ? (f / 4) * 8 + f % 4 : ((f - half) / 4) * 8 + 4 + (f - half) % 4;
}

absl::Status GemvQkvRopeBf16(const Bf16* x, int64_t m, int64_t k, const Bf16* w_qkv,
                             const float* bias, Bf16* qkv, const GemvQkvRope& rope,
                             const GemvWorkspace& ws, CudaStream stream, int force_splits) {
  const int64_t d = rope.head_dim;
  if (d <= 0 || d % 16 != 0 || rope.q_rows <= 0 || rope.k_rows <= 0 || rope.q_rows % d != 0 ||
      rope.k_rows % d != 0 || rope.q_rows + 2 * rope.k_rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GemvQkvRopeBf16: needs head_dim % 16 == 0 and whole heads (head_dim=", d,
                     " q_rows=", rope.q_rows, " k_rows=", rope.k_rows, ")"));
  }
  if (rope.positions == nullptr || rope.inv_freq == nullptr ||
      (rope.slots != nullptr && (rope.k_cache == nullptr || rope.v_cache == nullptr))) {
    return absl::InvalidArgumentError(
        "GemvQkvRopeBf16: null positions or inv_freq, or slots without both caches");
  }
  RopeArgs a{static_cast<int>(d),
             static_cast<int>(rope.q_rows),
             static_cast<int>(rope.k_rows),
             rope.positions,
             rope.inv_freq,
             rope.slots,
             rope.slots != nullptr ? rope.num_slots : 0,
             reinterpret_cast<uint16_t*>(rope.k_cache),
             reinterpret_cast<uint16_t*>(rope.v_cache)};
  const int64_t n = rope.q_rows + 2 * rope.k_rows;
  if (ws.staged && m == 1 && force_splits <= 0 && GemvStagedApplicable(x, m, n, k, w_qkv)) {
    return LaunchStaged(x, m, k, w_qkv, n, bias, qkv, Out::kQkvRope, a, stream);
  }
  return Launch(x, m, k, w_qkv, n, bias, qkv, Out::kQkvRope, a, ws, stream, force_splits);
}

}  // namespace tessera::kernels::cuda
