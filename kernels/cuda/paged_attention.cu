// Paged attention kernels (see paged_attention.h for the contract).
//
// Decode: grid (split, kv head x 16-head row block, sequence). A CTA loads
// the group's query heads (padded to 16 rows) once, streams its share of
// the context through double-buffered cp.async K/V tiles of TK keys, and
// each of its TK/16 warps folds 16 keys of every tile into its own
// online-softmax state with bf16 mma.sync (TK = 64 keys, or 32 when the
// grid has more CTAs than the device holds at once with 64). The warps are
// merged through shared memory; with one split the CTA writes the output,
// otherwise it writes (o/l, m, l) to the workspace and DecodeReduceKernel
// merges the splits. The split length depends only on (num_seqs,
// num_heads, max_seq_len), which also size the workspace. With DecodeRope
// the kernel also rotates q and writes the step's K and V (see
// DecodeKernel).
//
// Prefill: grid (head, 64-row query tile, sequence), 4 warps of 16 query
// rows sharing each K/V tile. Key tiles past the tile's last query
// position are never loaded; tiles entirely below a warp's first position
// skip the mask; a warp skips tiles entirely above its last position. With
// token-tree masks, tiles that reach past the chunk's trunk are masked per
// row by the ancestor bits (tiles below it still skip the mask).
//
// Thread-safety: see the header.
#include "kernels/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/per_device.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace attention_detail;  // NOLINT(build/namespaces): device helpers of this file

constexpr int kPrefillRows = 64;  // query rows per prefill CTA (4 warps x 16)
constexpr int kPrefillThreads = 128;
constexpr int kDecodeRows = 16;  // query heads per decode CTA (one mma row tile)
// Shortest decode split, in keys. 64 (so that a short context's tiles are
// spread over more CTAs and all in flight at once, merged by the reduce
// kernel) was slower on 2 x H200 in every decode step measured, alternating
// builds: TP=1 batch 64 5.53-5.56 ms per graph step against 5.16-5.18,
// TP=2 batch 64 3.68-3.69 against 3.47-3.48, batch 1 by 0.01-0.04 ms.
constexpr int kMinPartition = 256;
// Splits x seqs x heads to aim for: many short splits keep the last,
// partial wave of CTAs small (batch 32 x 4096 keys x 32 heads: 16 splits of
// 256 keys, 4096 CTAs at GQA 4); the partials cost ~3% extra traffic.
constexpr int64_t kDecodeTargetUnits = 16384;
constexpr float kLog2e = 1.4426950408889634f;

// Keys per shared-memory tile: 64, or 32 for head_dim 256 so that two
// stages plus the query tile fit the 99 KiB per-block limit of sm_86/89/120.
template <int D>
constexpr int KeyTile() {
  return D == 256 ? 32 : 64;
}
// Decode CTAs come with key tiles of KeyTile<D>() keys or of 32 (a smaller
// CTA, more of them resident: see LaunchDecode).
template <int TK>
constexpr int DecodeThreads() {
  return TK / 16 * 32;
}

template <int D>
constexpr size_t PrefillSmemBytes() {
  return sizeof(uint16_t) * (size_t{kPrefillRows} * D + 4 * size_t{KeyTile<D>()} * D);
}
template <int D, int TK>
constexpr size_t DecodeSmemBytes() {
  // The query tile, two stages of K and V tiles, DecodeRope's angles.
  return sizeof(uint16_t) * (size_t{kDecodeRows} * D + 4 * size_t{TK} * D) + sizeof(float2) * D / 2;
}

// K and V tiles of the double-buffer stage that key tile kt uses.
template <int D, int TK>
__device__ __forceinline__ uint16_t* KTile(uint16_t* stage_base, int kt) {
  return stage_base + (kt & 1) * (2 * TK * D);
}
template <int D, int TK>
__device__ __forceinline__ uint16_t* VTile(uint16_t* stage_base, int kt) {
  return stage_base + (kt & 1) * (2 * TK * D) + TK * D;
}

// ---------------------------------------------------------------------------
// Prefill.

template <int D>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillKernel(PagedAttentionParams p, int block_shift, int group, float scale_log2) {
  constexpr int TK = KeyTile<D>();
  extern __shared__ uint4 smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const stage_base = sq + kPrefillRows * D;  // stage i: K at 2*i*TK*D, V after it

  // Blocks start in x-fastest order: every head's tile of a row before the
  // next row, last (longest causal) rows first, so the short tiles fill the
  // tail.
  const int seq = blockIdx.z;
  const int head = blockIdx.x;
  const int q_tile = gridDim.y - 1 - blockIdx.y;
  const int q_begin = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - q_begin;
  const int row0 = q_tile * kPrefillRows;
  if (row0 >= q_len) return;  // uniform over the CTA
  const int rows_valid = min(kPrefillRows, q_len - row0);
  const int ctx_start = p.seq_lens[seq] - q_len;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  if (ctx_start < 0) {  // inconsistent lengths: zeros rather than garbage
    for (int c = threadIdx.x; c < rows_valid * (D / 8); c += kPrefillThreads) {
      const int row = c / (D / 8);
      const int chunk = c % (D / 8);
      *reinterpret_cast<uint4*>(p.out + int64_t{q_begin + row0 + row} * p.out_token_stride +
                                int64_t{head} * D + chunk * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }

  const KvSource src{p.k_cache,
                     p.v_cache,
                     p.block_tables + int64_t{seq} * p.block_table_stride,
                     block_shift,
                     int64_t{p.num_kv_heads} * D,
                     int64_t{head / group} * D};
  const int n_keys = ctx_start + row0 + rows_valid;  // keys the last valid row sees
  const int n_tiles = (n_keys + TK - 1) / TK;
  const int warp_first_pos = ctx_start + row0 + warp * 16;
  const int warp_last_pos = warp_first_pos + 15;
  const bool warp_active = warp * 16 < rows_valid;

  // The first K/V tile is in flight while the query tile loads.
  LoadKvTile<D, TK, kPrefillThreads>(stage_base, stage_base + TK * D, src, 0, n_keys);
  CpAsyncCommit();
  // Query tile -> shared memory (rows past q_len are zero).
  for (int c = threadIdx.x; c < kPrefillRows * (D / 8); c += kPrefillThreads) {
    const int row = c / (D / 8);
    const int chunk = c % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < rows_valid) {
      v = *reinterpret_cast<const uint4*>(p.q + int64_t{q_begin + row0 + row} * p.q_token_stride +
                                          int64_t{head} * D + chunk * 8);
    }
    *reinterpret_cast<uint4*>(sq + SwizzledOffset<D>(row, chunk)) = v;
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.f, 0.f};
  // Token trees: this thread's two rows' ancestor masks (rows past q_len
  // get none; their output is not written). Keys below the chunk and its
  // trunk (tree_base) are kept causally; key tree_base + j of a row needs,
  // unless the mask is all ones (causal), bit j.
  const bool tree = p.tree_ancestors != nullptr;
  const int tree_base = ctx_start + (tree && p.tree_prefix != nullptr ? p.tree_prefix[seq] : 0);
  uint64_t mask_lo = ~uint64_t{0}, mask_hi = ~uint64_t{0};  // rows g and g + 8
  if (tree) {
    const int row = row0 + warp * 16 + g;
    mask_lo = row < q_len ? p.tree_ancestors[q_begin + row] : 0;
    mask_hi = row + 8 < q_len ? p.tree_ancestors[q_begin + row + 8] : 0;
  }
  auto keep = [warp_first_pos, tree_base, tree, mask_lo, mask_hi](int row, int key) {
    if (key > warp_first_pos + row) return false;  // causal bound, trees included
    if (!tree || key < tree_base) return true;
    const uint64_t mask = row < 8 ? mask_lo : mask_hi;
    const int j = key - tree_base;
    return mask == ~uint64_t{0} || (j < 64 && ((mask >> j) & 1u) != 0);
  };

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      LoadKvTile<D, TK, kPrefillThreads>(KTile<D, TK>(stage_base, kt + 1),
                                         VTile<D, TK>(stage_base, kt + 1), src, (kt + 1) * TK,
                                         n_keys);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int key0 = kt * TK;
    if (warp_active && key0 <= warp_last_pos) {
      // Tiles entirely below the warp's first position (and, with a tree,
      // below the chunk's branching part) keep every score.
      const bool need_mask = key0 + TK - 1 > warp_first_pos || (tree && key0 + TK - 1 >= tree_base);
      WarpAttendTile<D, TK>(sq, warp * 16, KTile<D, TK>(stage_base, kt),
                            VTile<D, TK>(stage_base, kt), 0, key0, scale_log2, need_mask, keep, o,
                            m, l);
    }
    __syncthreads();
  }
  CpAsyncWait<0>();

  if (!warp_active) return;  // uniform over the warp
  const float sums[2] = {QuadSum(l[0]), QuadSum(l[1])};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warp * 16 + g + 8 * i;
    if (row >= rows_valid) continue;
    const float sum = sums[i];
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    uint16_t* dst = p.out + int64_t{q_begin + row0 + row} * p.out_token_stride + int64_t{head} * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * t) =
          PackBf16x2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
  }
}

// ---------------------------------------------------------------------------
// Decode.

struct DecodeLayout {
  int partition = 0;   // keys per split (a multiple of 64)
  int num_splits = 0;  // splits covering max_seq_len
};

DecodeLayout DecodeLayoutFor(int num_seqs, int num_heads, int max_seq_len) {
  DecodeLayout layout;
  const int64_t units = std::max<int64_t>(1, int64_t{num_seqs} * num_heads);
  const int64_t splits_wanted = std::max<int64_t>(1, (kDecodeTargetUnits + units - 1) / units);
  const int64_t len = std::max(1, max_seq_len);
  int64_t part = (len + splits_wanted - 1) / splits_wanted;
  part = (part + 63) / 64 * 64;
  part = std::max<int64_t>(part, kMinPartition);
  layout.partition = static_cast<int>(part);
  layout.num_splits = static_cast<int>((len + part - 1) / part);
  return layout;
}

struct WorkspaceLayout {
  size_t o_offset = 0, m_offset = 0, l_offset = 0, total = 0;
};

size_t RoundUp256(size_t x) { return (x + 255) / 256 * 256; }

WorkspaceLayout WorkspaceLayoutFor(int num_seqs, int num_heads, int head_dim, int num_splits) {
  WorkspaceLayout w;
  if (num_splits <= 1) return w;
  const size_t rows = size_t(num_seqs) * size_t(num_heads) * size_t(num_splits);
  w.o_offset = 0;
  w.m_offset = RoundUp256(rows * size_t(head_dim) * sizeof(float));
  w.l_offset = w.m_offset + RoundUp256(rows * sizeof(float));
  w.total = w.l_offset + RoundUp256(rows * sizeof(float));
  return w;
}

struct DecodeExtra {
  int block_shift;
  int group;       // query heads per kv head
  int row_blocks;  // ceil(group / 16)
  int partition;
  int num_splits;
  float scale_log2;
  float* part_o;  // [num_seqs, num_heads, num_splits, D] (o / l)
  float* part_m;  // [num_seqs, num_heads, num_splits] (log2 units)
  float* part_l;
  bool rotate;      // PagedAttentionParams::rope given: `rope` holds it
  DecodeRope rope;  // (copied: the kernel reads it by value)
};

// RoPE of a head of D bf16 values (src, as the qkv projection left it)
// is RopeItems<D>(rope_order) items; RotateItem does one: store(feature,
// packed) receives its rotated values in the normal order, 4 or 8
// consecutive features at a time (a packed uint2 or uint4). Without
// rope_order the head is in the normal order (item c: features 8c .. 8c+7
// and their partners D/2 on), with it in gemv.h's RoPE row order (item g:
// the 8-row group with features 4g .. 4g+3, then their partners).
// angles[i]: RopeAngle of feature i at the token's position.
//
// With `norm` (q/k norms; normal order only) the head is first
// RMS-normalized: each of its D/16 items adds its pairs' squares in pair
// order (AddPairSquares), the item's lanes sum those with xor shuffles at
// offsets D/32, ..., 1 (the order in which rope.cu's WarpSum meets them,
// its other lanes adding zeros), and every value is NormScale'd by the
// resulting HeadInvRms. So the warp must call it convergently with a head's
// items on aligned lanes (item = lane % (D/16)); a lane with src null
// takes part with zeros (its store may be skipped).
template <int D>
__device__ __forceinline__ int RopeItems(bool rope_order) {
  return rope_order ? D / 8 : D / 16;
}
template <int D, class Store>
__device__ __forceinline__ void RotateItem(const uint16_t* src, int item, const float2* angles,
                                           bool rope_order, const float* norm, float eps,
                                           Store&& store) {
  constexpr int kHalf = D / 2;
  // Value j (0..7) of 8 packed bf16 values.
  auto at = [](const uint4& v, int j) {
    const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return static_cast<uint16_t>(w >> ((j & 1) * 16));
  };
  // Pair j: x1 = value j1 of a, x2 = value j2 of b, feature f0 + j, packed
  // into lo / hi.
  float inv = 1.f;
  auto pair = [&](const uint4& a, int j1, const uint4& b, int j2, int j, int f0, uint32_t* lo,
                  uint32_t* hi) {
    float x1 = Bf16BitsToFloat(at(a, j1)), x2 = Bf16BitsToFloat(at(b, j2));
    if (norm != nullptr) {
      x1 = NormScale(x1, inv, norm[f0 + j]);
      x2 = NormScale(x2, inv, norm[f0 + j + kHalf]);
    }
    uint16_t l, h;
    RopeApply(x1, x2, angles[f0 + j], &l, &h);
    const int shift = (j & 1) * 16;
    lo[j / 2] |= static_cast<uint32_t>(l) << shift;
    hi[j / 2] |= static_cast<uint32_t>(h) << shift;
  };
  if (rope_order) {
    uint4 in = make_uint4(0, 0, 0, 0);
    if (src != nullptr) in = *reinterpret_cast<const uint4*>(src + item * 8);
    uint32_t lo[2] = {0, 0}, hi[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) pair(in, j, in, 4 + j, j, item * 4, lo, hi);
    store(item * 4, make_uint2(lo[0], lo[1]));
    store(kHalf + item * 4, make_uint2(hi[0], hi[1]));
  } else {
    uint4 a = make_uint4(0, 0, 0, 0), b = make_uint4(0, 0, 0, 0);
    if (src != nullptr) {
      a = *reinterpret_cast<const uint4*>(src + item * 8);
      b = *reinterpret_cast<const uint4*>(src + kHalf + item * 8);
    }
    if (norm != nullptr) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ss = AddPairSquares(ss, Bf16BitsToFloat(at(a, j)), Bf16BitsToFloat(at(b, j)));
      }
#pragma unroll
      for (int o = D / 32; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      inv = HeadInvRms(ss, D, eps);
    }
    uint32_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) pair(a, j, b, j, j, item * 8, lo, hi);
    store(item * 8, make_uint4(lo[0], lo[1], lo[2], lo[3]));
    store(kHalf + item * 8, make_uint4(hi[0], hi[1], hi[2], hi[3]));
  }
}

// A packed uint2 (4 bf16) or uint4 (8) at dst (8- or 16-byte aligned).
template <class V>
__device__ __forceinline__ void StoreBf16s(uint16_t* dst, const V& v) {
  *reinterpret_cast<V*>(dst) = v;
}

// DecodeRope: the new token's rotated K and its V into the cache, by the
// CTA's NT threads (nothing for a slot outside the cache).
template <int D, int NT>
__device__ __forceinline__ void WriteNewKv(const DecodeRope& r, int token, int kv_head,
                                           int64_t row_elems, const float2* angles) {
  const int64_t slot = r.slots[token];
  if (slot < 0 || slot >= r.num_slots) return;
  const int64_t src = int64_t{token} * r.kv_token_stride + int64_t{kv_head} * D;
  const int64_t dst = slot * row_elems + int64_t{kv_head} * D;
  // K's items on the first warp's first lanes, the whole warp taking part
  // (RotateItem's norm shuffles); V's 16-byte chunks from the second warp
  // on (D / 8 <= 32 <= NT - 32), so both go at once.
  static_assert(NT >= 64 && D / 8 <= NT - 32);
  const int items = RopeItems<D>(r.rope_order);  // <= 32
  if (threadIdx.x < 32) {
    const bool mine = static_cast<int>(threadIdx.x) < items;
    RotateItem<D>(mine ? r.k + src : nullptr, threadIdx.x % items, angles, r.rope_order, r.k_norm,
                  r.norm_eps, [&](int f, const auto& v) {
                    if (mine) StoreBf16s(r.k_cache + dst + f, v);
                  });
  }
  for (int c = static_cast<int>(threadIdx.x) - 32; c >= 0 && c < D / 8; c += NT) {
    *reinterpret_cast<uint4*>(r.v_cache + dst + c * 8) =
        *reinterpret_cast<const uint4*>(r.v + src + c * 8);
  }
}

template <int D, int TK>
__global__ void __launch_bounds__(DecodeThreads<TK>())
    DecodeKernel(PagedAttentionParams p, DecodeExtra x) {
  AllowDependentLaunch();  // the o_proj GEMV may stage its weights meanwhile
  static_assert(TK % 16 == 0 && TK <= KeyTile<D>());
  constexpr int NW = TK / 16;
  constexpr int NT = NW * 32;
  extern __shared__ uint4 smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const stage_base = sq + kDecodeRows * D;
  // Stage i: K tile at stage_base + 2 * i * TK * D, V tile right after it.

  const int split = blockIdx.x;
  const int kv_head = blockIdx.y / x.row_blocks;
  const int row_block = blockIdx.y % x.row_blocks;
  const int seq = blockIdx.z;
  const int head0 = kv_head * x.group + row_block * kDecodeRows;
  const int rows = min(kDecodeRows, x.group - row_block * kDecodeRows);
  const int token = p.query_start_loc != nullptr ? p.query_start_loc[seq] : seq;
  const int seq_len = p.seq_lens[seq];
  const int key_begin = split * x.partition;
  const int key_end = min(key_begin + x.partition, seq_len);
  uint16_t* out_row0 = p.out + int64_t{token} * p.out_token_stride + int64_t{head0} * D;

  if (key_begin >= key_end) {  // nothing to attend to in this split
    if (x.num_splits == 1) {   // (with splits, the reduce kernel writes zeros)
      for (int c = threadIdx.x; c < rows * (D / 8); c += NT) {
        *reinterpret_cast<uint4*>(out_row0 + (c / (D / 8)) * D + (c % (D / 8)) * 8) =
            make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }

  const KvSource src{p.k_cache,
                     p.v_cache,
                     p.block_tables + int64_t{seq} * p.block_table_stride,
                     x.block_shift,
                     int64_t{p.num_kv_heads} * D,
                     int64_t{kv_head} * D};
  const int n_tiles = (key_end - key_begin + TK - 1) / TK;
  // With DecodeRope, the CTA whose split holds the token's own position
  // stores its K and V first; the first tile is in flight meanwhile unless
  // it holds that key.
  const bool writes = x.rotate && key_end == seq_len;
  const bool first_tile_waits = writes && seq_len - 1 < key_begin + TK;
  if (!first_tile_waits) {
    LoadKvTile<D, TK, NT>(stage_base, stage_base + TK * D, src, key_begin, key_end);
    CpAsyncCommit();
  }
  if (x.rotate) {
    // (cos, sin) of every feature at the token's position, once, after the
    // stages; then the new K and V (the writing CTA), q's rows rotated
    // into the query tile, and zeros in its padding rows.
    float2* angles = reinterpret_cast<float2*>(stage_base + 4 * TK * D);
    const float pos = static_cast<float>(x.rope.positions[token]);
    for (int i = threadIdx.x; i < D / 2; i += NT) angles[i] = RopeAngle(pos, x.rope.inv_freq[i]);
    __syncthreads();
    if (writes) WriteNewKv<D, NT>(x.rope, token, kv_head, int64_t{p.num_kv_heads} * D, angles);
    // q's rows, item c of row c / items; every warp's lanes run the same
    // iterations (RotateItem's norm shuffles), those past the rows idle.
    const int items = RopeItems<D>(x.rope.rope_order);
    const uint16_t* q_row0 = p.q + int64_t{token} * p.q_token_stride + int64_t{head0} * D;
    for (int c0 = 0; c0 < rows * items; c0 += NT) {
      const int c = c0 + threadIdx.x;
      const int row = c / items;
      const bool mine = c < rows * items;
      RotateItem<D>(mine ? q_row0 + int64_t{row} * D : nullptr, c % items, angles,
                    x.rope.rope_order, x.rope.q_norm, x.rope.norm_eps, [&](int f, const auto& v) {
                      if (mine) StoreBf16s(sq + SwizzledOffset<D>(row, f / 8) + f % 8, v);
                    });
    }
    for (int c = rows * (D / 8) + threadIdx.x; c < kDecodeRows * (D / 8); c += NT) {
      *reinterpret_cast<uint4*>(sq + SwizzledOffset<D>(c / (D / 8), c % (D / 8))) =
          make_uint4(0, 0, 0, 0);
    }
    if (writes) __syncthreads();  // the new key's stores before any thread's copy of it
    if (first_tile_waits) {
      LoadKvTile<D, TK, NT>(stage_base, stage_base + TK * D, src, key_begin, key_end);
      CpAsyncCommit();
    }
  } else {
    for (int c = threadIdx.x; c < kDecodeRows * (D / 8); c += NT) {
      const int row = c / (D / 8);
      const int chunk = c % (D / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row < rows) {
        v = *reinterpret_cast<const uint4*>(p.q + int64_t{token} * p.q_token_stride +
                                            int64_t{head0 + row} * D + chunk * 8);
      }
      *reinterpret_cast<uint4*>(sq + SwizzledOffset<D>(row, chunk)) = v;
    }
  }

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.f, 0.f};
  auto keep = [key_end](int, int key) { return key < key_end; };

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) {
      LoadKvTile<D, TK, NT>(KTile<D, TK>(stage_base, kt + 1), VTile<D, TK>(stage_base, kt + 1), src,
                            key_begin + (kt + 1) * TK, key_end);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int key0 = key_begin + kt * TK + warp * 16;
    if (key0 < key_end) {
      WarpAttendTile<D, 16>(sq, 0, KTile<D, TK>(stage_base, kt), VTile<D, TK>(stage_base, kt),
                            warp * 16, key0, x.scale_log2, key0 + 16 > key_end, keep, o, m, l);
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  __syncthreads();  // the stage buffers are reused below

  // Merge the warps: each writes its unnormalized state, then the CTA combines.
  float* so = reinterpret_cast<float*>(stage_base);  // [NW][16][D]
  float* sm = so + NW * kDecodeRows * D;             // [NW][16]
  float* sl = sm + NW * kDecodeRows;                 // [NW][16]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = g + 8 * i;
    const float sum = QuadSum(l[i]);
    float* dst = so + (warp * kDecodeRows + row) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(dst + n * 8 + 2 * t) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
    }
    if (t == 0) {
      sm[warp * kDecodeRows + row] = m[i];
      sl[warp * kDecodeRows + row] = sum;
    }
  }
  __syncthreads();

  for (int e = threadIdx.x; e < rows * (D / 2); e += NT) {
    const int row = e / (D / 2);
    const int d = (e % (D / 2)) * 2;
    float mmax = kNegInf;
#pragma unroll
    for (int w = 0; w < NW; ++w) mmax = fmaxf(mmax, sm[w * kDecodeRows + row]);
    const float base = mmax == kNegInf ? 0.f : mmax;
    float sum = 0.f, o0 = 0.f, o1 = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float wt = Ex2(sm[w * kDecodeRows + row] - base);
      sum += sl[w * kDecodeRows + row] * wt;
      const float2 v = *reinterpret_cast<const float2*>(so + (w * kDecodeRows + row) * D + d);
      o0 += v.x * wt;
      o1 += v.y * wt;
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    if (x.num_splits == 1) {
      *reinterpret_cast<uint32_t*>(out_row0 + row * D + d) = PackBf16x2(o0 * inv, o1 * inv);
    } else {
      const int64_t idx = (int64_t{seq} * p.num_heads + head0 + row) * x.num_splits + split;
      *reinterpret_cast<float2*>(x.part_o + idx * D + d) = make_float2(o0 * inv, o1 * inv);
      if (d == 0) {
        x.part_m[idx] = mmax;
        x.part_l[idx] = sum;
      }
    }
  }
}

// Merges the splits of one (sequence, head): grid (num_heads, num_seqs),
// D / 2 threads, two dims each.
template <int D>
__global__ void __launch_bounds__(D / 2) DecodeReduceKernel(PagedAttentionParams p, DecodeExtra x) {
  AllowDependentLaunch();
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int token = p.query_start_loc != nullptr ? p.query_start_loc[seq] : seq;
  const int seq_len = p.seq_lens[seq];
  const int n_valid =
      seq_len <= 0 ? 0 : min(x.num_splits, (seq_len + x.partition - 1) / x.partition);
  const int64_t base = (int64_t{seq} * p.num_heads + head) * x.num_splits;
  float mmax = kNegInf;
  for (int i = 0; i < n_valid; ++i) mmax = fmaxf(mmax, x.part_m[base + i]);
  const float shift = mmax == kNegInf ? 0.f : mmax;
  const int d = threadIdx.x * 2;
  float sum = 0.f, o0 = 0.f, o1 = 0.f;
  for (int i = 0; i < n_valid; ++i) {
    const float wt = x.part_l[base + i] * Ex2(x.part_m[base + i] - shift);
    const float2 v = *reinterpret_cast<const float2*>(x.part_o + (base + i) * D + d);
    sum += wt;
    o0 += v.x * wt;
    o1 += v.y * wt;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  *reinterpret_cast<uint32_t*>(p.out + int64_t{token} * p.out_token_stride + int64_t{head} * D +
                               d) = PackBf16x2(o0 * inv, o1 * inv);
}

// ---------------------------------------------------------------------------
// Host side.

absl::Status ValidateCommon(const PagedAttentionParams& p, const char* what) {
  auto bad = [what](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", parts...));
  };
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return bad("head_dim ", p.head_dim, " is not supported (64, 128 or 256)");
  }
  if (p.num_seqs < 0 || p.num_seqs > 65535) {
    return bad("num_seqs ", p.num_seqs, " is outside [0, 65535]");
  }
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return bad("num_heads ", p.num_heads, " must be a positive multiple of num_kv_heads ",
               p.num_kv_heads);
  }
  if (p.num_heads > 65535) return bad("num_heads ", p.num_heads, " exceeds 65535");
  if (Log2IfPowerOfTwo(p.block_size) < 0 || p.block_size > (1 << 20)) {
    return bad("block_size ", p.block_size, " must be a power of two <= 2^20");
  }
  if (!std::isfinite(p.scale)) return bad("scale is not finite");
  if (p.max_seq_len < 0) return bad("max_seq_len ", p.max_seq_len, " is negative");
  if (p.q == nullptr || p.k_cache == nullptr || p.v_cache == nullptr || p.out == nullptr ||
      p.block_tables == nullptr || p.seq_lens == nullptr) {
    return bad("q, k_cache, v_cache, out, block_tables and seq_lens must be non-null");
  }
  if (!Aligned16(p.q) || !Aligned16(p.k_cache) || !Aligned16(p.v_cache) || !Aligned16(p.out)) {
    return bad("q, k_cache, v_cache and out must be 16-byte aligned");
  }
  const int64_t row = int64_t{p.num_heads} * p.head_dim;
  if (p.q_token_stride < row || p.q_token_stride % 8 != 0) {
    return bad("q_token_stride ", p.q_token_stride, " must be >= num_heads * head_dim (", row,
               ") and a multiple of 8");
  }
  if (p.out_token_stride < row || p.out_token_stride % 8 != 0) {
    return bad("out_token_stride ", p.out_token_stride, " must be >= num_heads * head_dim (", row,
               ") and a multiple of 8");
  }
  const int64_t blocks_needed = (int64_t{p.max_seq_len} + p.block_size - 1) / p.block_size;
  if (p.block_table_stride < blocks_needed) {
    return bad("block_table_stride ", p.block_table_stride, " is below the ", blocks_needed,
               " blocks max_seq_len ", p.max_seq_len, " needs");
  }
  return absl::OkStatus();
}

absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " launch failed: ", cudaGetErrorString(err)));
}

template <int D>
absl::Status LaunchPrefill(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr size_t smem = PrefillSmemBytes<D>();
  if (cudaFuncSetAttribute(PrefillKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    return LaunchStatus("paged attention prefill (shared memory attribute)");
  }
  const dim3 grid(p.num_heads, (p.max_query_len + kPrefillRows - 1) / kPrefillRows, p.num_seqs);
  const float scale_log2 = p.scale * kLog2e;
  PrefillKernel<D><<<grid, kPrefillThreads, smem, stream>>>(
      p, Log2IfPowerOfTwo(p.block_size), p.num_heads / p.num_kv_heads, scale_log2);
  return LaunchStatus("paged attention prefill");
}

// DecodeKernel<D, TK> CTAs the current device holds at once, with its
// shared-memory limit raised (0 when that or the query fails).
template <int D, int TK>
int ResidentDecodeCtas() {
  static PerDevice<int> resident;
  const int* v = resident.Current([](int& ctas, int dev) {
    constexpr size_t smem = DecodeSmemBytes<D, TK>();
    int sms = 0, per_sm = 0;
    if (cudaFuncSetAttribute(DecodeKernel<D, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DecodeKernel<D, TK>,
                                                      DecodeThreads<TK>(), smem) != cudaSuccess) {
      cudaGetLastError();
      ctas = 0;
      return;
    }
    ctas = sms * per_sm;
  });
  return v != nullptr ? *v : 0;
}

template <int D, int TK>
absl::Status LaunchDecodeKernel(const PagedAttentionParams& p, const DecodeExtra& x,
                                const dim3& grid, cudaStream_t stream) {
  constexpr size_t smem = DecodeSmemBytes<D, TK>();
  if (cudaFuncSetAttribute(DecodeKernel<D, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    return LaunchStatus("paged attention decode (shared memory attribute)");
  }
  DecodeKernel<D, TK><<<grid, DecodeThreads<TK>(), smem, stream>>>(p, x);
  return LaunchStatus("paged attention decode");
}

// The grid's CTAs use KeyTile<D>()-key tiles while the device holds them
// all at once; a grid beyond that takes 32-key tiles, whose CTAs are a
// third the size, so that many more are resident (H200, 32 query / 8 kv
// heads, d 128, 192-key contexts: 64 sequences 15.7 µs against 21.2 with
// 64-key tiles, but 16 sequences 10.8 against 7.4 and one TP=2 rank's 16 /
// 4 heads at 64 sequences 10.9 against 9.3: fewer CTAs, each walking more
// tiles). Tried and dropped: three stages instead of two when a split has
// three tiles or more and the grid still fits at once, so that a short
// context's tiles are mostly in flight together. Slower in every decode
// step measured (2 x H200, alternating builds, two rounds: one-GPU batch 1
// 4.33 / 4.35 ms against 4.30 / 4.31, TP=2 batch 64 3.60 / 3.56 against
// 3.53 / 3.52); the larger CTAs leave less shared memory to the staged
// o_proj GEMV that runs beside them and fewer CTAs resident.
template <int D>
absl::Status LaunchDecode(const PagedAttentionParams& p, const DecodeExtra& x,
                          cudaStream_t stream) {
  const dim3 grid(x.num_splits, p.num_kv_heads * x.row_blocks, p.num_seqs);
  bool small_tiles = false;
  if constexpr (KeyTile<D>() > 32) {
    const int resident = ResidentDecodeCtas<D, KeyTile<D>()>();
    small_tiles = resident > 0 && int64_t{grid.x} * grid.y * grid.z > resident;
  }
  absl::Status launched = small_tiles ? LaunchDecodeKernel<D, 32>(p, x, grid, stream)
                                      : LaunchDecodeKernel<D, KeyTile<D>()>(p, x, grid, stream);
  if (!launched.ok()) return launched;
  if (x.num_splits > 1) {
    DecodeReduceKernel<D><<<dim3(p.num_heads, p.num_seqs), D / 2, 0, stream>>>(p, x);
    return LaunchStatus("paged attention decode reduce");
  }
  return absl::OkStatus();
}

}  // namespace

namespace attention_detail {

absl::Status ValidateAttentionParams(const PagedAttentionParams& p, const char* what,
                                     bool prefill) {
  if (absl::Status s = ValidateCommon(p, what); !s.ok()) return s;
  if (!prefill) return absl::OkStatus();
  if (p.rope != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": RoPE in the attention kernel is for decode only"));
  }
  if (p.query_start_loc == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": query_start_loc must be non-null"));
  }
  if (p.max_query_len < 0 || p.max_query_len > p.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": max_query_len ", p.max_query_len,
                                                   " must be in [0, max_seq_len = ", p.max_seq_len,
                                                   "]"));
  }
  return absl::OkStatus();
}

}  // namespace attention_detail

size_t PagedAttentionDecodeWorkspaceBytes(int num_seqs, int num_heads, int head_dim,
                                          int max_seq_len) {
  if (num_seqs <= 0 || num_heads <= 0 || head_dim <= 0) return 0;
  const DecodeLayout layout = DecodeLayoutFor(num_seqs, num_heads, max_seq_len);
  return WorkspaceLayoutFor(num_seqs, num_heads, head_dim, layout.num_splits).total;
}

absl::Status PagedAttentionDecode(const PagedAttentionParams& p, CUstream_st* stream) {
  if (absl::Status s = ValidateCommon(p, "PagedAttentionDecode"); !s.ok()) return s;
  if (p.num_seqs == 0) return absl::OkStatus();
  const DecodeLayout layout = DecodeLayoutFor(p.num_seqs, p.num_heads, p.max_seq_len);
  const WorkspaceLayout ws =
      WorkspaceLayoutFor(p.num_seqs, p.num_heads, p.head_dim, layout.num_splits);
  if (ws.total > 0) {
    if (p.workspace == nullptr || p.workspace_bytes < ws.total) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedAttentionDecode: workspace of ", p.workspace_bytes, " bytes (",
                       p.workspace == nullptr ? "null" : "non-null", ") is below the ", ws.total,
                       " bytes PagedAttentionDecodeWorkspaceBytes asks for"));
    }
    if (!Aligned16(p.workspace)) {
      return absl::InvalidArgumentError("PagedAttentionDecode: workspace must be 16-byte aligned");
    }
  }
  const int group = p.num_heads / p.num_kv_heads;
  DecodeExtra x{};
  x.block_shift = Log2IfPowerOfTwo(p.block_size);
  x.group = group;
  x.row_blocks = (group + kDecodeRows - 1) / kDecodeRows;
  x.partition = layout.partition;
  x.num_splits = layout.num_splits;
  x.scale_log2 = p.scale * kLog2e;
  if (ws.total > 0) {
    char* base = static_cast<char*>(p.workspace);
    x.part_o = reinterpret_cast<float*>(base + ws.o_offset);
    x.part_m = reinterpret_cast<float*>(base + ws.m_offset);
    x.part_l = reinterpret_cast<float*>(base + ws.l_offset);
  }
  if (int64_t{p.num_kv_heads} * x.row_blocks > 65535) {
    return absl::InvalidArgumentError("PagedAttentionDecode: too many kv heads for the grid");
  }
  if (p.rope != nullptr) {
    const DecodeRope& r = *p.rope;
    const int64_t row = int64_t{p.num_kv_heads} * p.head_dim;
    if (r.positions == nullptr || r.inv_freq == nullptr || r.k == nullptr || r.v == nullptr ||
        r.slots == nullptr || r.k_cache == nullptr || r.v_cache == nullptr) {
      return absl::InvalidArgumentError(
          "PagedAttentionDecode: RoPE needs positions, inv_freq, k, v, slots and both caches");
    }
    if (!Aligned16(r.k) || !Aligned16(r.v) || !Aligned16(r.k_cache) || !Aligned16(r.v_cache) ||
        r.kv_token_stride < row || r.kv_token_stride % 8 != 0 || r.num_slots < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PagedAttentionDecode: RoPE's k, v and caches must be 16-byte aligned, kv_token_stride ",
          r.kv_token_stride, " a multiple of 8 and >= num_kv_heads * head_dim (", row,
          "), num_slots ", r.num_slots, " >= 0"));
    }
    if (r.rope_order && (r.q_norm != nullptr || r.k_norm != nullptr)) {
      return absl::InvalidArgumentError(
          "PagedAttentionDecode: RoPE's q/k norms need q and k in the normal order, not "
          "rope_order");
    }
    if (!std::isfinite(r.norm_eps) || r.norm_eps < 0.f) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedAttentionDecode: RoPE's norm_eps ", r.norm_eps, " must be >= 0"));
    }
    x.rotate = true;
    x.rope = r;
  }
  switch (p.head_dim) {
    case 64:
      return LaunchDecode<64>(p, x, stream);
    case 128:
      return LaunchDecode<128>(p, x, stream);
    default:
      return LaunchDecode<256>(p, x, stream);
  }
}

absl::Status PagedAttentionPrefill(const PagedAttentionParams& p, CUstream_st* stream) {
  if (absl::Status s = ValidateAttentionParams(p, "PagedAttentionPrefill", /*prefill=*/true);
      !s.ok()) {
    return s;
  }
  if (p.num_seqs == 0 || p.max_query_len == 0) return absl::OkStatus();
  switch (p.head_dim) {
    case 64:
      return LaunchPrefill<64>(p, stream);
    case 128:
      return LaunchPrefill<128>(p, stream);
    default:
      return LaunchPrefill<256>(p, stream);
  }
}

}  // namespace tessera::kernels::cuda
