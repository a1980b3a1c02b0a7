// Grouped bf16 GEMM of the MoE prefill path (moe_grouped_gemm.h).
//
// CTA (bx, y): N tile bx of the M tile slot y. Slot y belongs to the expert
// e with tile_start[e] <= y < tile_start[e + 1] (binary search); its rows
// are [m0, min(m0 + 128, offsets[e + 1])). Rows past the expert's end load
// a copy of its last row (always valid) and are not stored.
//
// Shared memory per stage: A and B tiles of 128 rows x 64 bf16 (128-byte
// rows); 16-byte chunk c of row r sits at chunk c ^ (r & 7), so the eight
// rows an ldmatrix reads hit eight different bank groups.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/per_device.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kBM = kMoeGroupTileRows;  // 128
constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kStages = 3;
constexpr int kThreads = 256;  // 8 warps: 2 (M) x 4 (N), 64 x 32 each
constexpr int kTileElems = kBM * kBK;
constexpr int kStageElems = 2 * kTileElems;
constexpr size_t kSmemBytes = sizeof(uint16_t) * kStages * kStageElems;  // 96 KiB
constexpr size_t kSmemAllocBytes = kSmemBytes + 1024;                    // + alignment
constexpr int kGateUpCols = kBN / 2;  // act columns per gate/up tile

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
// d += a * b for one 16x8x16 bf16 tile, fp32 accumulators.
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int Swizzle(int row, int chunk) {
  return row * kBK + ((chunk ^ (row & 7)) << 3);
}
__device__ __forceinline__ float RoundBf16(float v) { return Bf16BitsToFloat(FloatToBf16Bits(v)); }
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) |
         (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
}

struct GemmArgs {
  const Bf16* a;  // x (gathered through row_token) or act (grouped rows)
  bool gather;
  const Bf16* b;  // stacked expert weights [E, N rows, K]
  int64_t b_expert_stride;
  int k;          // reduction length, % kBK == 0
  int64_t inter;  // gate/up: the up rows start at row inter
  Bf16* c;
  int64_t ldc;
  MoeGroups g;
};

// The expert owning M tile slot y: the largest e with tile_start[e] <= y
// (experts without tiles share the next one's start, and lose to it).
__device__ __forceinline__ int TileExpert(const int32_t* tile_start, int experts, int y) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_start[mid] <= y) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The global rows this thread copies into the A and B tiles: rows
// (t / 8) + 32 i of each tile, 16-byte chunk t % 8.
template <bool kGateUp>
struct TileSources {
  const Bf16* a[4];
  const Bf16* b[4];

  __device__ TileSources(const GemmArgs& args, int expert, int32_t m0, int32_t m_end) {
    const int t = threadIdx.x, chunk = t & 7, r = t >> 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = r + 32 * i;
      const int32_t m = min(m0 + row, m_end - 1);
      const int64_t a_row = args.gather ? args.g.row_token[m] : m;
      a[i] = args.a + a_row * args.k + chunk * 8;
      // Gate/up: warp column block i holds 16 gate rows, then the same 16 up rows.
      const int64_t b_row =
          kGateUp ? (r < 16 ? 0 : args.inter) + blockIdx.x * kGateUpCols + i * 16 + (r & 15)
                  : static_cast<int64_t>(blockIdx.x) * kBN + row;
      b[i] = args.b + expert * args.b_expert_stride + b_row * args.k + chunk * 8;
    }
  }

  __device__ void Load(uint16_t* stage, int kt) const {
    const int t = threadIdx.x, chunk = t & 7;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int off = Swizzle((t >> 3) + 32 * i, chunk);
      CpAsync16(stage + off, a[i] + kt * kBK);
      CpAsync16(stage + kTileElems + off, b[i] + kt * kBK);
    }
  }
};

// acc += the warp's 64 x 32 block of one stage's A . B^T. Row blocks of 16
// at or past `valid` (the tile's rows that belong to the expert) are
// skipped: a partial last tile (on average half of one per expert) then
// costs the tensor cores only its real rows. The test is warp-uniform.
__device__ __forceinline__ void ComputeStage(const uint16_t* stage, int valid,
                                             float (&acc)[4][4][4]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const uint16_t* sa = stage;
  const uint16_t* sb = stage + kTileElems;
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    uint32_t af[4][4], bf[2][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      if (wm * 64 + mi * 16 >= valid) break;
      Ldsm4(af[mi], sa + Swizzle(wm * 64 + mi * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      const int row = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
      Ldsm4(bf[nj], sb + Swizzle(row, kk * 2 + ((lane >> 3) & 1)));
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      if (wm * 64 + mi * 16 >= valid) break;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        Mma16816(acc[mi][ni], af[mi], bf[ni >> 1][(ni & 1) * 2], bf[ni >> 1][(ni & 1) * 2 + 1]);
      }
    }
  }
}

// Stores the warp's results of rows < m_end: gate/up as silu(gate) * up
// (n tiles 0, 1 are gate, 2, 3 the up of the same columns), else as is.
template <bool kGateUp>
__device__ __forceinline__ void StoreTile(const GemmArgs& args, const float (&acc)[4][4][4],
                                          int32_t m0, int32_t m_end) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int qcol = (lane & 3) * 2;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t m = m0 + wm * 64 + mi * 16 + (lane >> 2) + half * 8;
      if (m >= m_end) continue;
      Bf16* row = args.c + m * args.ldc;
      if (kGateUp) {
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const float* gate = &acc[mi][ni][half * 2];
          const float* up = &acc[mi][ni + 2][half * 2];
          const int64_t col =
              static_cast<int64_t>(blockIdx.x) * kGateUpCols + wn * 16 + ni * 8 + qcol;
          *reinterpret_cast<uint32_t*>(row + col) =
              PackBf16(SiluTimes(RoundBf16(gate[0]), RoundBf16(up[0])),
                       SiluTimes(RoundBf16(gate[1]), RoundBf16(up[1])));
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int64_t col = static_cast<int64_t>(blockIdx.x) * kBN + wn * 32 + ni * 8 + qcol;
          *reinterpret_cast<uint32_t*>(row + col) =
              PackBf16(acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1]);
        }
      }
    }
  }
}

// The expert and rows [m0, m_end) of this CTA's M tile slot; false for a
// slot this step does not use.
__device__ __forceinline__ bool FindTile(const MoeGroups& g, int* expert, int32_t* m0,
                                         int32_t* m_end) {
  const int y = static_cast<int>(blockIdx.y);
  if (y >= g.tile_start[g.num_experts]) return false;
  *expert = TileExpert(g.tile_start, g.num_experts, y);
  *m0 = g.offsets[*expert] + (y - g.tile_start[*expert]) * kBM;
  *m_end = g.offsets[*expert + 1];
  return true;
}

// The dynamic shared memory, aligned up to 1024 bytes (the wgmma swizzle
// atom; kSmemAllocBytes leaves room for it).
__device__ __forceinline__ uint16_t* AlignedSmem() {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                     ~uintptr_t{1023});
}

template <bool kGateUp>
__device__ __forceinline__ void MmaSyncGemm(const GemmArgs& args) {
  int expert;
  int32_t m0, m_end;
  if (!FindTile(args.g, &expert, &m0, &m_end)) return;
  uint16_t* smem = AlignedSmem();
  const TileSources<kGateUp> src(args, expert, m0, m_end);
  const int k_tiles = args.k / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) src.Load(smem + s * kStageElems, s);
    CpAsyncCommit();
  }
  float acc[4][4][4] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile kt landed for all; stage (kt - 1) % kStages is free
    const int next = kt + kStages - 1;
    if (next < k_tiles) src.Load(smem + (next % kStages) * kStageElems, next);
    CpAsyncCommit();
    ComputeStage(smem + (kt % kStages) * kStageElems, m_end - m0, acc);
  }
  StoreTile<kGateUp>(args, acc, m0, m_end);
}

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads) MoeGemmKernel(GemmArgs args) {
  MmaSyncGemm<kGateUp>(args);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// wgmma shared-memory matrix descriptor, 128-byte swizzle (the layout of
// Swizzle() with 1024-byte aligned stages), as prefill_attention_sm90.cu.
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr) {
  constexpr uint32_t kLbo = 16, kSbo = 1024;  // 8-row core groups 1024 bytes apart
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((kLbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((kSbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void PinF(float& x) { asm volatile("" : "+f"(x)::"memory"); }

#define TESSERA_MOE_R8(i)                                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// d += A * B^T, m64n128k16, both operands K-major in shared memory.
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  // scale-d is a predicate operand (true: accumulate into d).
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : TESSERA_MOE_R8(0), TESSERA_MOE_R8(8), TESSERA_MOE_R8(16), TESSERA_MOE_R8(24),
        TESSERA_MOE_R8(32), TESSERA_MOE_R8(40), TESSERA_MOE_R8(48), TESSERA_MOE_R8(56)
      : "l"(desc_a), "l"(desc_b));
}
#undef TESSERA_MOE_R8

// Warpgroup wg's 64 rows x 128 columns of one stage (4 k16 steps), waited for.
__device__ __forceinline__ void WgmmaStage(const uint16_t* stage, int wg, float (&d)[64]) {
  const uint32_t a = SmemAddr(stage) + wg * 64 * 128;
  const uint32_t b = SmemAddr(stage + kTileElems);
#pragma unroll
  for (int i = 0; i < 64; ++i) PinF(d[i]);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int ks = 0; ks < kBK / 16; ++ks) WgmmaSS128(d, Desc(a + ks * 32), Desc(b + ks * 32));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < 64; ++i) PinF(d[i]);
}

// Accumulator d[4j + 2i + c] of thread (warp w of the warpgroup, lane
// 4g + q) is row 16w + g + 8i, column 8j + 2q + c. Gate/up: column blocks
// j = 4ii + {0, 1} are gate columns whose up partners are j + 2.
template <bool kGateUp>
__device__ __forceinline__ void StoreWgTile(const GemmArgs& args, const float (&d)[64], int wg,
                                            int32_t m0, int32_t m_end) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, q2 = (lane & 3) * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int32_t m = m0 + wg * 64 + 16 * w + g + 8 * i;
    if (m >= m_end) continue;
    Bf16* row = args.c + m * args.ldc;
    if (kGateUp) {
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 4 * ii + jj;
          const float* gate = &d[4 * j + 2 * i];
          const float* up = &d[4 * (j + 2) + 2 * i];
          const int64_t col =
              static_cast<int64_t>(blockIdx.x) * kGateUpCols + ii * 16 + jj * 8 + q2;
          *reinterpret_cast<uint32_t*>(row + col) =
              PackBf16(SiluTimes(RoundBf16(gate[0]), RoundBf16(up[0])),
                       SiluTimes(RoundBf16(gate[1]), RoundBf16(up[1])));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t col = static_cast<int64_t>(blockIdx.x) * kBN + 8 * j + q2;
        *reinterpret_cast<uint32_t*>(row + col) = PackBf16(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]);
      }
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The same tiles, loads and pipeline as MoeGemmKernel, the products on
// wgmma: warpgroup wg computes rows 64 wg .. 64 wg + 63 of the tile (and
// skips them when they are all past the expert's end). After a stage's
// cp.async group lands, fence.proxy.async makes the generic-proxy writes
// visible to wgmma (async proxy); each stage's wgmmas are waited for before
// the next barrier, so the prefetch into that stage cannot race them.
// The wgmma body is built only into the sm_90a image; any other image of
// it (an SM 9.0 device running, say, a plain sm_90 build) runs the mma.sync
// body instead, so the choice can never give wrong results.
template <bool kGateUp>
__global__ void __launch_bounds__(kThreads) MoeGemmSm90Kernel(GemmArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  int expert;
  int32_t m0, m_end;
  if (!FindTile(args.g, &expert, &m0, &m_end)) return;
  uint16_t* smem = AlignedSmem();
  const TileSources<kGateUp> src(args, expert, m0, m_end);
  const int k_tiles = args.k / kBK;
  const int wg = threadIdx.x >> 7;
  const bool work = wg * 64 < m_end - m0;  // uniform over the warpgroup
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) src.Load(smem + s * kStageElems, s);
    CpAsyncCommit();
  }
  float d[64] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) src.Load(smem + (next % kStages) * kStageElems, next);
    CpAsyncCommit();
    if (work) WgmmaStage(smem + (kt % kStages) * kStageElems, wg, d);
  }
  StoreWgTile<kGateUp>(args, d, wg, m0, m_end);
#else
  MmaSyncGemm<kGateUp>(args);
#endif
}

// Per device: the kernels' shared-memory limits raised once, and whether
// the wgmma kernels run (SM 9.0: the build's only 9.x image is sm_90a).
struct DeviceSetup {
  cudaError_t error = cudaSuccess;
  bool sm90 = false;
};

const DeviceSetup* Setup() {
  static PerDevice<DeviceSetup> setups;
  return setups.Current([](DeviceSetup& s, int dev) {
    int major = 0, minor = 0;
    for (const void* k : {reinterpret_cast<const void*>(MoeGemmKernel<true>),
                          reinterpret_cast<const void*>(MoeGemmKernel<false>),
                          reinterpret_cast<const void*>(MoeGemmSm90Kernel<true>),
                          reinterpret_cast<const void*>(MoeGemmSm90Kernel<false>)}) {
      if (s.error == cudaSuccess) {
        s.error = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemAllocBytes));
      }
    }
    if (s.error == cudaSuccess) {
      s.error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    }
    if (s.error == cudaSuccess) {
      s.error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    }
    if (s.error != cudaSuccess) cudaGetLastError();
    s.sm90 = major == 9 && minor == 0;
  });
}

template <bool kGateUp>
absl::Status Launch(const GemmArgs& args, int64_t n_tiles, int64_t num_tokens,
                    MoeGemmKernelKind kernel, CudaStream stream, const char* what) {
  const int64_t m_slots = MoeMaxGemmTiles(num_tokens, args.g.top_k, args.g.num_experts);
  if (m_slots > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", num_tokens, " tokens need more than 65535 M tiles"));
  }
  const DeviceSetup* setup = Setup();
  if (setup == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(what, ": no CUDA device"));
  TESSERA_CUDA_RETURN_IF_ERROR(setup->error);
  bool wgmma = setup->sm90;
  if (kernel == MoeGemmKernelKind::kMmaSync) wgmma = false;
  if (kernel == MoeGemmKernelKind::kWgmma && !setup->sm90) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": the wgmma kernel needs SM 9.0"));
  }
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_slots));
  if (wgmma) {
    MoeGemmSm90Kernel<kGateUp><<<grid, kThreads, kSmemAllocBytes, AsCuda(stream)>>>(args);
  } else {
    MoeGemmKernel<kGateUp><<<grid, kThreads, kSmemAllocBytes, AsCuda(stream)>>>(args);
  }
  return CheckLastLaunch(what);
}

absl::Status CheckShapes(const MoeExpertWeights& w, const char* what) {
  if (!MoeGroupedGemmSupports(w.hidden, w.inter)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": hidden ", w.hidden, " / inter ",
                                                   w.inter,
                                                   " not tiled (needs H % 128 == 0, I % 64 == 0)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool MoeGroupedGemmSupports(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % kBN == 0 && inter % kGateUpCols == 0 &&
         hidden <= INT32_MAX && inter <= INT32_MAX;
}

absl::Status MoeGemmGateUp(const Bf16* x, int64_t num_tokens, const MoeExpertWeights& w,
                           const MoeGroups& g, Bf16* act, CudaStream stream,
                           MoeGemmKernelKind kernel) {
  constexpr const char* kWhat = "MoeGemmGateUp";
  if (absl::Status s = ValidateMoeExpertStep(kWhat, w, g, num_tokens, x, act); !s.ok()) return s;
  if (absl::Status s = CheckShapes(w, kWhat); !s.ok()) return s;
  if (num_tokens == 0) return absl::OkStatus();
  const GemmArgs args{
      x,   true,    w.gate_up, 2 * w.inter * w.hidden, static_cast<int>(w.hidden), w.inter,
      act, w.inter, g};
  return Launch<true>(args, w.inter / kGateUpCols, num_tokens, kernel, stream, kWhat);
}

absl::Status MoeGemmDown(const Bf16* act, int64_t num_tokens, const MoeExpertWeights& w,
                         const MoeGroups& g, Bf16* y, CudaStream stream, MoeGemmKernelKind kernel) {
  constexpr const char* kWhat = "MoeGemmDown";
  if (absl::Status s = ValidateMoeExpertStep(kWhat, w, g, num_tokens, act, y); !s.ok()) return s;
  if (absl::Status s = CheckShapes(w, kWhat); !s.ok()) return s;
  if (num_tokens == 0) return absl::OkStatus();
  const GemmArgs args{act, false,    w.down, w.hidden * w.inter, static_cast<int>(w.inter), 0,
                      y,   w.hidden, g};
  return Launch<false>(args, w.hidden / kBN, num_tokens, kernel, stream, kWhat);
}

}  // namespace tessera::kernels::cuda
