// Device building blocks of the paged attention kernels: PTX wrappers
// (cp.async, ldmatrix, bf16 mma.sync m16n8k16, ex2), the swizzled shared
// memory tile layout, the paged K/V tile loader and the per-warp
// flash-attention step, and the host-side parameter checks; included by
// the attention .cu files (paged_attention.cu, prefill_attention_sm90.cu).
//
// Shared-memory tiles hold rows of D bf16 values (D/8 chunks of 16 bytes);
// chunk c of row r is stored at chunk position c ^ (r & 7), so the eight
// row addresses of one ldmatrix 8x8 matrix fall into eight different bank
// groups. D >= 64 keeps the XOR inside the row.
//
// Thread-safety: device code; every function is called by whole warps
// (the mma/ldmatrix/shuffle ones) or whole CTAs (the loaders) as noted.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_attention.h"

namespace tessera::kernels::cuda::attention_detail {

constexpr float kNegInf = -__builtin_huge_valf();

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
__device__ __forceinline__ void Ldsm4Trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
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

// 2^x; exact 0 for x = -inf.
__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats to bf16x2 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Element offset of chunk `chunk` (8 elements) of row `row` in a swizzled tile.
template <int D>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Where the K/V rows of one kv head live.
struct KvSource {
  const uint16_t* k;
  const uint16_t* v;
  const int32_t* table;  // this sequence's block table row
  int block_shift;       // log2(block_size)
  int64_t slot_stride;   // num_kv_heads * D
  int64_t head_offset;   // kv_head * D
};

// The shared-memory layout of LoadKvTile's tiles by default: one
// swizzled row of D values per key (SwizzledOffset).
template <int D>
struct SwizzledRows {
  __device__ __forceinline__ int operator()(int row, int chunk) const {
    return SwizzledOffset<D>(row, chunk);
  }
};

// Whole CTA (NT threads): starts cp.async copies of keys [key0, key0 + TK)
// into the K and V tiles, 16-byte chunk `chunk` of key row `row` at element
// offset(row, chunk); keys >= key_end are zero-filled (their block table
// entries are not read).
template <int D, int TK, int NT, class Offset = SwizzledRows<D>>
__device__ __forceinline__ void LoadKvTile(uint16_t* sk, uint16_t* sv, const KvSource& src,
                                           int key0, int key_end, Offset offset = Offset()) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kChunks = TK * kChunksPerRow;
  static_assert(kChunks % NT == 0, "tile chunks must split evenly over the threads");
  const int block_mask = (1 << src.block_shift) - 1;
#pragma unroll
  for (int i = 0; i < kChunks / NT; ++i) {
    const int c = i * NT + static_cast<int>(threadIdx.x);
    const int row = c / kChunksPerRow;
    const int chunk = c % kChunksPerRow;
    const int key = key0 + row;
    const int off = offset(row, chunk);
    if (key < key_end) {
      const int64_t block = src.table[key >> src.block_shift];
      const int64_t slot = (block << src.block_shift) + (key & block_mask);
      const int64_t g = slot * src.slot_stride + src.head_offset + chunk * 8;
      CpAsync16(sk + off, src.k + g);
      CpAsync16(sv + off, src.v + g);
    } else {
      *reinterpret_cast<uint4*>(sk + off) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(sv + off) = make_uint4(0, 0, 0, 0);
    }
  }
}

// One warp: folds NK keys of a K/V tile into the online-softmax state of
// 16 query rows. sq holds the query tile (rows q_row0 .. q_row0 + 15 are
// this warp's); the keys are tile rows key_row0 .. key_row0 + NK - 1 with
// absolute indices key_abs0 ... When need_mask, keep(local_row, key_abs)
// decides which scores survive. State per thread (rows g = lane / 4 and
// g + 8): o[n][0..1] are dims n*8 + 2*(lane%4) + {0,1} of row g, o[n][2..3]
// of row g + 8; m is the running max (log2 units), l this thread's share of
// the running sum.
template <int D, int NK, typename Keep>
__device__ __forceinline__ void WarpAttendTile(const uint16_t* sq, int q_row0, const uint16_t* sk,
                                               const uint16_t* sv, int key_row0, int key_abs0,
                                               float scale_log2, bool need_mask, Keep keep,
                                               float (&o)[D / 8][4], float (&m)[2], float (&l)[2]) {
  static_assert(NK % 16 == 0, "keys per warp step must be a multiple of 16");
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int mi = lane >> 3;  // which 8x8 matrix this lane addresses in ldmatrix.x4
  const int r8 = lane & 7;

  float s[NK / 8][4];
#pragma unroll
  for (int n = 0; n < NK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;

    // S = Q K^T.
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    {
      const int row = q_row0 + (mi & 1) * 8 + r8;
      Ldsm4(a, sq + SwizzledOffset<D>(row, ks * 2 + (mi >> 1)));
    }
#pragma unroll
    for (int np = 0; np < NK / 16; ++np) {
      uint32_t b[4];
      const int row = key_row0 + np * 16 + (mi >> 1) * 8 + r8;
      Ldsm4(b, sk + SwizzledOffset<D>(row, ks * 2 + (mi & 1)));
      Mma16816(s[2 * np], a, b[0], b[1]);
      Mma16816(s[2 * np + 1], a, b[2], b[3]);
    }
  }

  // Scale into log2 units, mask, row max over the quad.
  float mx[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int n = 0; n < NK / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[n][e] * scale_log2;
      if (need_mask && !keep(g + 8 * (e >> 1), key_abs0 + n * 8 + 2 * t + (e & 1))) v = kNegInf;
      s[n][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  }
  float alpha[2];
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float m_new = fmaxf(m[i], mx[i]);
    base[i] = m_new == kNegInf ? 0.f : m_new;  // a fully masked row stays at 0 weight
    alpha[i] = Ex2(m[i] - base[i]);
    m[i] = m_new;
  }
  float row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NK / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = Ex2(s[n][e] - base[e >> 1]);
      s[n][e] = pe;
      row_sum[e >> 1] += pe;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + row_sum[i];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }

  // O += P V; the S accumulators of two key n-tiles form one A fragment.
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    uint32_t a[4];
    a[0] = PackBf16x2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = PackBf16x2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    const int row = key_row0 + kk * 16 + (mi & 1) * 8 + r8;
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      Ldsm4Trans(b, sv + SwizzledOffset<D>(row, dp * 2 + (mi >> 1)));
      Mma16816(o[2 * dp], a, b[0], b[1]);
      Mma16816(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Sum of l over the four threads of a quad (they share rows).
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// ---- host side, shared by the attention entry points ----

inline bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// log2(x) for a power of two, else -1.
inline int Log2IfPowerOfTwo(int x) {
  if (x <= 0 || (x & (x - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// The host-side checks of a paged attention call (shapes, strides, pointers,
// alignment, block table stride); INVALID_ARGUMENT messages start with
// `what`. `prefill` adds query_start_loc and max_query_len.
absl::Status ValidateAttentionParams(const PagedAttentionParams& p, const char* what, bool prefill);

}  // namespace tessera::kernels::cuda::attention_detail
