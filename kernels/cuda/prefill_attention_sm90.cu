// wgmma prefill attention for SM 9.0 (see prefill_attention_sm90.h).
//
// Shared-memory tiles (Q: 128 rows, K and V: 128 keys; rows of head_dim
// bf16) are stored as head_dim/64 column blocks of [rows][64] elements, one
// 128-byte line per row, and 16-byte chunk c of row r sits at chunk
// position c ^ (r & 7): the canonical 128-byte-swizzle layout the wgmma
// descriptors describe (swizzle mode 1), each block 1024-byte aligned.
//   Q, K as K-major operands: 8-row core groups 1024 bytes apart (SBO); one
//     k16 step is 32 bytes inside a 128-byte line; the leading offset is
//     unused for swizzled K-major layouts.
//   V as the N-major B operand of P V (imm-trans-b = 1): 8-key groups 1024
//     bytes apart (SBO), the two 64-column blocks of head_dim 128 one
//     column block apart (LBO = 128 keys * 128 bytes).
// Accumulator fragment (m64nN, fp32), thread t of a warpgroup, warp w =
// t / 32, g = lane / 4, q = lane % 4: d[4j + 2i + c] is row 16w + g + 8i,
// column 8j + 2q + c. The A register fragment of P for k-step kk is the
// mma.m16n8k16 A fragment, built from the S accumulators of column blocks
// 2kk and 2kk + 1 of the same thread.
//
// PrefillSm90WsKernel (below) has a producer warpgroup that gathers K/V
// through mbarriers while each consumer pipelines its softmax against its
// own P V product and the two consumers' tensor-core sections alternate;
// see the comment above that kernel. (Three other schedules, a plain one,
// a ping-pong one without a producer and a warp-specialized one without
// ping-pong, lost to it: tests/bench/results/paged_attention_h200.json,
// 269 / 290 / 372 against 387 TFLOP/s at 2k tokens.)
//
// Thread-safety: see the header.
#include "kernels/cuda/prefill_attention_sm90.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/paged_attention.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace attention_detail;  // NOLINT(build/namespaces): device helpers of this file

constexpr int kRows = 128;  // query rows per CTA (two warpgroups of 64)
constexpr int kKeys = 128;  // keys per K/V tile
constexpr int kStages = 3;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr size_t SmemBytes() {
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes.
  return sizeof(uint16_t) * (size_t{kRows} * D + size_t{kStages} * 2 * kKeys * D) + 1024;
}

// Element offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` in a
// swizzled tile of R rows.
template <int R>
__device__ __forceinline__ int TileOffset(int row, int chunk) {
  return (chunk >> 3) * (R * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// wgmma shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr, uint32_t lbo_bytes,
                                         uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins a register value in program order relative to the volatile asm
// around it (wgmma operands must not be read or written by other
// instructions between the issue and the wait).
__device__ __forceinline__ void PinF(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void PinU(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
// Named barrier `id` over `count` threads: wait for it, or only arrive.
__device__ __forceinline__ void NamedBarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The accumulator operands of the wgmma wrappers below: the register
// list %0..%31 (or %0..%63) of the instruction and the matching "+f"
// operands d[0..31] (or d[0..63]).
#define TESSERA_WG_REGS32                                                                          \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25," \
  "%26,%27,%28,%29,%30,%31"
#define TESSERA_WG_REGS64                                                                      \
  TESSERA_WG_REGS32                                                                            \
  ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%" \
  "54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define TESSERA_WG_OUT8(d, i)                                                                 \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define TESSERA_WG_OUT32(d) \
  TESSERA_WG_OUT8(d, 0), TESSERA_WG_OUT8(d, 8), TESSERA_WG_OUT8(d, 16), TESSERA_WG_OUT8(d, 24)
#define TESSERA_WG_OUT64(d)                                                                    \
  TESSERA_WG_OUT32(d), TESSERA_WG_OUT8(d, 32), TESSERA_WG_OUT8(d, 40), TESSERA_WG_OUT8(d, 48), \
      TESSERA_WG_OUT8(d, 56)

// d (+)= A * B, m64n128k16, A and B from shared memory (descriptors), both K-major.
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TESSERA_WG_REGS64
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : TESSERA_WG_OUT64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d += A * B, m64n128k16, A from registers (the mma.m16n8k16 A fragment per warp),
// B from shared memory, MN-major (imm-trans-b = 1).
__device__ __forceinline__ void WgmmaRS128(float (&d)[64], const uint32_t (&a)[4],
                                           uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" TESSERA_WG_REGS64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : TESSERA_WG_OUT64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

// d += A * B, m64n64k16, A from registers (the mma.m16n8k16 A fragment per warp),
// B from shared memory, MN-major (imm-trans-b = 1).
__device__ __forceinline__ void WgmmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" TESSERA_WG_REGS32
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : TESSERA_WG_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

#undef TESSERA_WG_REGS32
#undef TESSERA_WG_REGS64
#undef TESSERA_WG_OUT8
#undef TESSERA_WG_OUT32
#undef TESSERA_WG_OUT64

template <int D>
__device__ __forceinline__ void WgmmaPV(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void WgmmaPV<128>(float (&o)[64], const uint32_t (&a)[4],
                                             uint64_t desc) {
  WgmmaRS128(o, a, desc);
}
template <>
__device__ __forceinline__ void WgmmaPV<64>(float (&o)[32], const uint32_t (&a)[4], uint64_t desc) {
  WgmmaRS64(o, a, desc);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// A CTA's query tile and where its keys come from.
struct QueryTile {
  int seq, head, q_begin, row0, rows_valid, ctx_start;
  KvSource src;
};

// This CTA's tile. Blocks start in x-fastest order: every head's tile of a
// row before the next row, last (longest causal) rows first, so the short
// tiles fill the tail; the heads of a GQA group read the same K/V tiles
// close in time. False when the CTA has nothing to do (uniform over the
// CTA): its tile lies past the sequence's new tokens, or the lengths are
// inconsistent, in which case its rows of out are zeroed rather than left
// as garbage.
template <int D, int kThreadCount>
__device__ __forceinline__ bool FindQueryTile(const PagedAttentionParams& p, int block_shift,
                                              int group, QueryTile* tile) {
  tile->seq = blockIdx.z;
  tile->head = blockIdx.x;
  tile->q_begin = p.query_start_loc[tile->seq];
  const int q_len = p.query_start_loc[tile->seq + 1] - tile->q_begin;
  tile->row0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  if (tile->row0 >= q_len) return false;
  tile->rows_valid = min(kRows, q_len - tile->row0);
  tile->ctx_start = p.seq_lens[tile->seq] - q_len;
  if (tile->ctx_start < 0) {
    for (int c = threadIdx.x; c < tile->rows_valid * (D / 8); c += kThreadCount) {
      const int row = c / (D / 8);
      const int chunk = c % (D / 8);
      *reinterpret_cast<uint4*>(p.out +
                                int64_t{tile->q_begin + tile->row0 + row} * p.out_token_stride +
                                int64_t{tile->head} * D + chunk * 8) = make_uint4(0, 0, 0, 0);
    }
    return false;
  }
  tile->src = KvSource{p.k_cache,
                       p.v_cache,
                       p.block_tables + int64_t{tile->seq} * p.block_table_stride,
                       block_shift,
                       int64_t{p.num_kv_heads} * D,
                       int64_t{tile->head / group} * D};
  return true;
}

// --- The warp-specialized ping-pong kernel ---------------------------------
//
// 384 threads: warpgroups 0 and 1 are the consumers (query rows 0..63 and
// 64..127 of the tile), warpgroup 2 the producer. The producer gives most
// of its registers to the consumers (setmaxnreg: 40 vs 232 per thread; the
// kernel is compiled for 168 = 65536 / 384, and 128 * (168 - 40) =
// 256 * (232 - 168), so the consumers' increase is exactly what the
// producer frees; the consumers need about 218). ptxas only allocates the
// consumer code with the larger budget when nothing in the kernel can trap
// (a __trap() in a wait loop made it spill and serialize the wgmmas), hence
// the sticky time-out flag below rather than a trap.
//
// The producer gathers the query tile, then K and V of every key tile with
// cp.async (zero-filling past the sequence) into a ring of three stages,
// each with a "full" and an "empty" mbarrier:
//   after issuing a tile's copies (K and V together, one table lookup per
//   row for both; the query tile with tile 0) each producer thread arrives
//   on the stage's full barrier with cp.async.mbarrier.arrive.noinc (count
//   128, one arrival per producer thread), which the hardware completes
//   once that thread's earlier copies have landed, so the producer never
//   waits for data and keeps up to three tiles in flight; the consumers
//   make the copies visible to the async proxy (fence.proxy.async) after
//   their full wait. Before reusing a stage the producer waits for its
//   empty barrier (count 256, one arrival per consumer thread once its P V
//   product of the tile there has completed).
//   Measured before this form (H200, 8k tokens, Nsight Compute): a producer
//   that waited for each of its own cp.async groups (one tile in flight)
//   and recomputed every address for K and V separately, with spinning
//   barrier waits, issued half of all instructions and left the consumers
//   waiting for data; 341 TFLOP/s against PingPong's 367.
// Tile j sits in stage j % 3 and is that stage's (j / 3)-th use, so every
// wait's parity follows from j alone: full (j / 3) & 1, empty
// (j / 3 - 1) & 1. No barrier can run a phase ahead of a waiter: the
// producer refills a stage only after all consumers released the previous
// tile there, which they do only after waiting for it.
//
// Both consumer warpgroups walk all key tiles of the CTA (warpgroup 1 may
// compute one fully masked tile more than it needs, at most), so their
// barrier sequences are identical and fixed. Each consumer overlaps its own
// softmax with its own tensor-core work (intra-warpgroup pipelining):
//   iteration j: issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1} (two commit
//   groups); wait for S_j only (wait_group 1); the softmax of S_j runs
//   while P V is on the tensor cores; wait for P V (wait_group 0), release
//   stage j - 1, rescale O and pack P_j.
// The key tiles at or past the warpgroup's first query row's diagonal run a
// masked copy of the loop body (branch-free masking: a select per element);
// the others run without mask code. All mbarrier waits sit where no wgmma is
// in flight (ptxas serializes wgmma around loops and divergent branches),
// and they are bounded: a wait that lasts over 4 s gives up and sets the
// thread's sticky time-out flag (later waits then return at once), so a
// broken phase protocol cannot hang the device; consumer threads that
// timed out write NaN for their rows, which any parity check reports.
//
// The two consumers' issue sections are ordered too: issue sections (S_j and
// P V of one iteration) with named barriers 1 and 2 (count 256: 128 syncing
// + 128 arriving): consumer 1 arrives once on consumer 0's barrier up
// front; each consumer syncs on its own barrier before its section and
// arrives on the other's after it, except consumer 1 after its last
// section. With both walking the same n tiles that makes n syncs and n
// arrivals per barrier, strictly alternating, so one consumer's softmax
// runs while the other's products occupy the tensor cores.
constexpr int kWsThreads = 384;  // two consumer warpgroups + the producer warpgroup
constexpr int kWsProducerRegs = 40;
constexpr int kWsConsumerRegs = 232;
// The kernel starts with 65536 / 384 -> 168 registers per thread; the
// consumers' increase must equal what the producer frees, or setmaxnreg.inc
// waits forever.
static_assert(128 * (168 - kWsProducerRegs) == 256 * (kWsConsumerRegs - 168),
              "setmaxnreg budgets must balance");

template <int D>
constexpr size_t WsSmemBytes() {
  // The tiles as SmemBytes, then 2 * kStages mbarriers (8 bytes each).
  return SmemBytes<D>() + 2 * kStages * 8;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A waiting thread sleeps until the phase completes or this long passes
// (instead of spinning: the spinning waits of an earlier version issued a
// third of the kernel's instructions, on the consumers' schedulers).
constexpr uint32_t kMbarSuspendHintNs = 1000000;
// Waits (mbarrier.cuh MbarWait) give up after 4 s. No trap then: see the
// warp-specialized kernel's comment.
constexpr uint64_t kMbarTimeoutNs = 4000000000ull;
// One arrival on `bar` once every cp.async this thread issued before has
// completed (the barrier's expected count includes it: .noinc).
__device__ __forceinline__ void CpAsyncMbarArriveNoinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// bar.arrive only where `pred` holds (a predicated instruction, no branch).
__device__ __forceinline__ void NamedBarArriveIf(bool pred, int id, int count) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p bar.arrive %1, %2;\n}\n" ::"r"(
                   static_cast<int>(pred)),
               "r"(id), "r"(count)
               : "memory");
}
template <int N>
__device__ __forceinline__ void WgWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Producer warpgroup (tid 0..127): cp.async of keys [key0, key0 + kKeys)
// of K and V into a stage's swizzled tiles, branch-free (keys >= key_end
// copy 0 bytes, i.e. zero-fill, from key key_end - 1's address). Thread
// tid copies 16-byte chunk tid % (D/8) of rows tid / (D/8) + i * kPass:
// every such row has the same (row & 7), so its shared-memory offset is the
// first row's plus i * kPass lines (immediate offsets), and its global
// offset inside a cache slot is the same for K and V. One table lookup per
// row for both copies; a row's address is one 32 x 32 -> 64-bit multiply-add
// (page * page bytes, which Validate keeps below 4 GiB, onto the thread's
// K base) plus the slot's 32-bit offset in the page; V is K plus a constant.
template <int D>
__device__ __forceinline__ void WsGatherKv(uint32_t k_dst, uint32_t v_dst, const char* k_thread,
                                           int64_t v_minus_k, const KvSource& src, int key0,
                                           int key_end, int first_row) {
  constexpr int kPass = 128 / (D / 8);  // rows per pass of the 128 threads
  const int block_mask = (1 << src.block_shift) - 1;
  const uint32_t row_bytes = static_cast<uint32_t>(src.slot_stride) * 2u;
  const uint32_t page_bytes = row_bytes << src.block_shift;
#pragma unroll 4
  for (int i = 0; i < kKeys / kPass; ++i) {
    const int key = key0 + first_row + i * kPass;
    const bool valid = key < key_end;
    const int safe_key = valid ? key : key_end - 1;
    const uint32_t page = static_cast<uint32_t>(src.table[safe_key >> src.block_shift]);
    const char* k = k_thread + static_cast<uint64_t>(page) * page_bytes +
                    static_cast<uint32_t>(safe_key & block_mask) * row_bytes;
    const uint32_t bytes = valid ? 16u : 0u;
    const uint32_t line = static_cast<uint32_t>(i * kPass * 128);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(k_dst + line), "l"(k),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(v_dst + line),
                 "l"(k + v_minus_k), "r"(bytes)
                 : "memory");
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int D>
__global__ void __launch_bounds__(kWsThreads, 1)
    PrefillSm90WsKernel(PagedAttentionParams p, int block_shift, int group, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  constexpr int kKSteps = D / 16;
  constexpr int kPSteps = kKeys / 16;
  constexpr int kStageElems = 2 * kKeys * D;
  extern __shared__ uint4 smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  uint16_t* const sq = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(smem_raw) +
                                                   ((1024 - (raw_addr & 1023)) & 1023));
  uint16_t* const stages = sq + kRows * D;
  // Barriers: full[s], empty[s] at bars + 8 * (2 s + i).
  const uint32_t bars = SmemAddr(stages + kStages * kStageElems);
  auto full = [&](int s) { return bars + 8 * (2 * s + 0); };
  auto empty = [&](int s) { return bars + 8 * (2 * s + 1); };

  QueryTile tile;
  if (!FindQueryTile<D, kWsThreads>(p, block_shift, group, &tile)) return;
  const int head = tile.head;
  const int q_begin = tile.q_begin;
  const int row0 = tile.row0;
  const int rows_valid = tile.rows_valid;
  const int ctx_start = tile.ctx_start;
  const KvSource& src = tile.src;

  const int n_keys = ctx_start + row0 + rows_valid;  // keys the last valid row sees
  const int n_tiles = (n_keys + kKeys - 1) / kKeys;  // >= 1

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full(s), 128);
      MbarInit(empty(s), 256);
    }
  }
  __syncthreads();         // the last CTA-wide barrier: the roles split below
  bool timed_out = false;  // see MbarWait

  // Warp index, made warp-uniform for the compiler.
  const int warp_id = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  if (warp_id >= 8) {
    // ---- Producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    const int tid = threadIdx.x - 256;
    constexpr int kChunksPerRow = D / 8;
    const int chunk = tid % kChunksPerRow;
    const int first_row = tid / kChunksPerRow;
    {
      // Query tile (rows past q_len zero-filled from row 0's address).
      const uint32_t sq_addr = SmemAddr(sq);
#pragma unroll 4
      for (int r = first_row; r < kRows; r += 128 / kChunksPerRow) {
        const bool valid = r < rows_valid;
        const uint16_t* g = p.q + int64_t{q_begin + row0 + (valid ? r : 0)} * p.q_token_stride +
                            int64_t{head} * D + chunk * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                         sq_addr + 2 * TileOffset<kRows>(r, chunk)),
                     "l"(g), "r"(valid ? 16u : 0u)
                     : "memory");
      }
    }
    const uint16_t* const k_thread = src.k + src.head_offset + chunk * 8;
    // The byte distance from a K element to its V element (the same slot,
    // head and column in the other cache).
    const int64_t v_minus_k = static_cast<int64_t>(reinterpret_cast<uintptr_t>(src.v) -
                                                   reinterpret_cast<uintptr_t>(src.k));
    const uint32_t thread_dst = 2 * TileOffset<kKeys>(first_row, chunk);
    // Each thread's copies of tile j complete its arrival on full[j % 3]
    // (cp.async.mbarrier.arrive.noinc): the producer never waits for its
    // own copies, only for free stages, so up to kStages tiles are in
    // flight. The query tile rides with tile 0.
    for (int j = 0; j < n_tiles; ++j) {
      const int s = j % kStages;
      if (j >= kStages)
        MbarWait<kMbarSuspendHintNs>(empty(s), ((j / kStages) + 1) & 1, kMbarTimeoutNs, timed_out);
      const uint32_t k_dst = SmemAddr(stages + s * kStageElems) + thread_dst;
      WsGatherKv<D>(k_dst, k_dst + kKeys * D * 2, reinterpret_cast<const char*>(k_thread),
                    v_minus_k, src, j * kKeys, n_keys, first_row);
      CpAsyncMbarArriveNoinc(full(s));
    }
    CpAsyncWait<0>();  // no copy outlives its thread
    return;
  }

  // ---- Consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsConsumerRegs));
  const int cwg = warp_id >> 2;             // consumer: query rows 64 cwg .. 64 cwg + 63
  const int warp = (threadIdx.x >> 5) & 3;  // warp inside the warpgroup
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int wg_first_pos = ctx_start + row0 + cwg * 64;
  const int pos0 = wg_first_pos + warp * 16 + g;  // this thread's rows: pos0 and pos0 + 8
  const uint32_t q_addr = SmemAddr(sq) + cwg * 64 * 128;
  const uint32_t stages_addr = SmemAddr(stages);
  // Tiles [0, n_plain) lie wholly at or below every row of this warpgroup.
  const int n_plain = min(n_tiles, (wg_first_pos + 1) / kKeys);

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float s[kKeys / 2];
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.f;
  uint32_t pa[kPSteps][4];
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.f, 0.f};
  float alpha[2] = {0.f, 0.f};
  float row_sum[2] = {0.f, 0.f};

  auto k_addr_of = [&](int j) { return stages_addr + (j % kStages) * kStageElems * 2; };
  auto issue_s = [&](int j) {
    const uint32_t k_addr = k_addr_of(j);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const uint32_t col = ks >> 2;
      const uint32_t k_off = (ks & 3) * 32u;
      const uint64_t da = Desc(q_addr + col * (kRows * 128) + k_off, 16, 1024);
      const uint64_t db = Desc(k_addr + col * (kKeys * 128) + k_off, 16, 1024);
      WgmmaSS128(s, da, db, ks > 0 ? 1 : 0);
    }
    WgCommit();
  };
  auto issue_pv = [&](int j) {
    const uint32_t v_addr = k_addr_of(j) + kKeys * D * 2;
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint64_t dv = Desc(v_addr + kk * (16 * 128), kKeys * 128, 1024);
      WgmmaPV<D>(o, pa[kk], dv);
    }
    WgCommit();
  };
  auto pin_s = [&] {
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) PinF(s[i]);
  };
  auto pin_o_pa = [&] {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) PinF(o[i]);
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) PinU(pa[kk][r]);
    }
  };
  // Online softmax of S_j in place (log2 units): new maxima, alpha, P
  // (fp32, in s), row sums. Masked: keys past a row's position get -inf
  // (selects, no branches).
  auto softmax = [&](int j, auto masked) {
    const int key0 = j * kKeys;
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int jj = 0; jj < kKeys / 8; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[4 * jj + e];  // raw: the scale is folded into the exponent
        if constexpr (decltype(masked)::value) {
          const int limit = pos0 + 8 * (e >> 1) - key0 - 2 * t;
          v = 8 * jj + (e & 1) > limit ? kNegInf : v;
        }
        s[4 * jj + e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    }
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i] * scale_log2);
      base[i] = m_new == kNegInf ? 0.f : m_new;  // a fully masked row stays at 0 weight
      alpha[i] = Ex2(m[i] - base[i]);
      m[i] = m_new;
      row_sum[i] = 0.f;
    }
#pragma unroll
    for (int jj = 0; jj < kKeys / 8; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = Ex2(fmaf(s[4 * jj + e], scale_log2, -base[e >> 1]));
        s[4 * jj + e] = pe;
        row_sum[e >> 1] += pe;
      }
    }
  };
  // After P V of the previous tile completed: rescale O, update l, pack P_j.
  auto finish = [&] {
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + row_sum[i];
#pragma unroll
    for (int jj = 0; jj < D / 8; ++jj) {
      o[4 * jj + 0] *= alpha[0];
      o[4 * jj + 1] *= alpha[0];
      o[4 * jj + 2] *= alpha[1];
      o[4 * jj + 3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      pa[kk][0] = PackBf16x2(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = PackBf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = PackBf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = PackBf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  const int my_bar = 1 + cwg;     // this consumer's ping-pong barrier
  const int other_bar = 2 - cwg;  // the other's

  // Tile 0 (no P V to overlap yet).
  if (cwg == 1) NamedBarArrive(1, 256);  // consumer 0 goes first
  MbarWait<kMbarSuspendHintNs>(full(0), 0, kMbarTimeoutNs, timed_out);
  FenceProxyAsync();
  NamedBarSync(my_bar, 256);
  pin_s();
  WgFence();
  issue_s(0);
  NamedBarArriveIf(!(cwg == 1 && n_tiles == 1), other_bar, 256);
  WgWait<0>();
  pin_s();
  softmax(0, std::integral_constant<bool, true>{});
  finish();

  // Tiles 1 .. n_tiles - 1: S_j and P_{j-1} V_{j-1} in flight together.
  auto step = [&](int j, auto masked) {
    MbarWait<kMbarSuspendHintNs>(full(j % kStages), (j / kStages) & 1, kMbarTimeoutNs,
                                 timed_out);  // K_j, V_j (V_{j-1} before)
    FenceProxyAsync();
    NamedBarSync(my_bar, 256);
    pin_s();
    pin_o_pa();
    WgFence();
    issue_s(j);
    issue_pv(j - 1);
    NamedBarArriveIf(!(cwg == 1 && j == n_tiles - 1), other_bar, 256);
    WgWait<1>();  // S_j done; P V may still run
    pin_s();
    softmax(j, masked);
    WgWait<0>();
    pin_o_pa();
    MbarArrive(empty((j - 1) % kStages));
    finish();
  };
  const int plain_end = max(1, n_plain);
  for (int j = 1; j < plain_end; ++j) step(j, std::integral_constant<bool, false>{});
  for (int j = plain_end; j < n_tiles; ++j) step(j, std::integral_constant<bool, true>{});

  // P V of the last tile.
  pin_o_pa();
  WgFence();
  issue_pv(n_tiles - 1);
  WgWait<0>();
  pin_o_pa();

  const float sums[2] = {QuadSum(l[0]), QuadSum(l[1])};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = cwg * 64 + warp * 16 + g + 8 * i;
    if (row >= rows_valid) continue;
    const float inv = timed_out ? __int_as_float(0x7fc00000) : sums[i] > 0.f ? 1.f / sums[i] : 0.f;
    uint16_t* dst = p.out + int64_t{q_begin + row0 + row} * p.out_token_stride + int64_t{head} * D;
#pragma unroll
    for (int jj = 0; jj < D / 8; ++jj) {
      *reinterpret_cast<uint32_t*>(dst + 8 * jj + 2 * t) =
          PackBf16x2(o[4 * jj + 2 * i] * inv, o[4 * jj + 2 * i + 1] * inv);
    }
  }
#else
  __trap();
#endif
}

// Writes 1 when the image that runs on this device is the sm_90a one.
__global__ void Sm90aProbeKernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

absl::Status Validate(const PagedAttentionParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillAttentionSm90: head_dim ", p.head_dim,
                     " is not supported (64 or 128; use PagedAttentionPrefill for others)"));
  }
  if (absl::Status s = ValidateAttentionParams(p, "PrefillAttentionSm90", /*prefill=*/true);
      !s.ok()) {
    return s;
  }
  // The gather computes addresses with 32-bit page strides.
  const int64_t page_bytes = int64_t{p.block_size} * p.num_kv_heads * p.head_dim * 2;
  if (page_bytes >= (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillAttentionSm90: a cache block of ", page_bytes,
                     " bytes is not supported (below 4 GiB; use PagedAttentionPrefill for that)"));
  }
  // The softmax takes row maxima of the unscaled scores and folds the scale
  // into the exponent, which needs scale > 0 (every model's 1/sqrt(d) is).
  if (!(p.scale > 0.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillAttentionSm90: scale ", p.scale,
                     " is not positive (use PagedAttentionPrefill for that)"));
  }
  return absl::OkStatus();
}

absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorString(err)));
}

// FAILED_PRECONDITION unless the current device is SM 9.0 and runs an SM
// 9.0 image of the kernel compiled from sm_90 PTX or newer (not a JIT of
// older PTX, whose body is the trapping stub). Capture-safe.
template <int D>
const void* KernelFor() {
  return reinterpret_cast<const void*>(&PrefillSm90WsKernel<D>);
}

absl::Status CheckDevice(const void* kernel) {
  int device = 0;
  int major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "PrefillAttentionSm90: no usable CUDA device (", cudaGetErrorString(err), ")"));
  }
  if (major != 9 || minor != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("PrefillAttentionSm90 needs an SM 9.0 device; device ", device, " is SM ",
                     major, ".", minor));
  }
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        "PrefillAttentionSm90: this binary has no kernel image for SM 9.0 (build with sm_90a in "
        "-DTESSERA_CUDA_ARCHS)");
  }
  if (attr.binaryVersion != 90 || attr.ptxVersion < 90) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PrefillAttentionSm90: the kernel image for this device is binary ", attr.binaryVersion,
        " from PTX ", attr.ptxVersion, ", not sm_90a (build with sm_90a in -DTESSERA_CUDA_ARCHS)"));
  }
  return absl::OkStatus();
}

template <int D>
absl::Status Launch(const PagedAttentionParams& p, cudaStream_t stream) {
  const void* fn = KernelFor<D>();
  const size_t smem = WsSmemBytes<D>();
  // The device checks and the shared-memory opt-in, once per device (bit
  // d of `ready`; devices past 63 are checked on every call).
  static std::atomic<uint64_t> ready{0};
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "PrefillAttentionSm90: no usable CUDA device (", cudaGetErrorString(err), ")"));
  }
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || (ready.load(std::memory_order_acquire) & bit) == 0) {
    if (absl::Status s = CheckDevice(fn); !s.ok()) return s;
    if (const cudaError_t err = cudaFuncSetAttribute(
            fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        err != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InternalError(
          absl::StrCat("PrefillAttentionSm90: allowing ", smem,
                       " bytes of shared memory failed: ", cudaGetErrorString(err)));
    }
    ready.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(p.num_heads, (p.max_query_len + kRows - 1) / kRows, p.num_seqs);
  const int block_shift = Log2IfPowerOfTwo(p.block_size);
  const int group = p.num_heads / p.num_kv_heads;
  const float scale_log2 = p.scale * kLog2e;
  PrefillSm90WsKernel<D><<<grid, kWsThreads, smem, stream>>>(p, block_shift, group, scale_log2);
  return LaunchStatus("PrefillAttentionSm90 launch");
}

}  // namespace

bool PrefillAttentionSm90Available(std::string* why) {
  auto fail = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (absl::Status s = CheckDevice(KernelFor<128>()); !s.ok()) {
    return fail(std::string(s.message()));
  }
  int* flag = nullptr;
  if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail("PrefillAttentionSm90: cudaMalloc for the probe failed");
  }
  int host = 0;
  Sm90aProbeKernel<<<1, 1>>>(flag);
  const cudaError_t err = cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(flag);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(
        absl::StrCat("PrefillAttentionSm90: probe kernel failed: ", cudaGetErrorString(err)));
  }
  if (host != 1) {
    return fail(
        "PrefillAttentionSm90: the device runs a non-sm_90a image of this binary (build with "
        "sm_90a in -DTESSERA_CUDA_ARCHS)");
  }
  return true;
}

bool PrefillAttentionSm90Supports(const PagedAttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128) && p.tree_ancestors == nullptr && p.scale > 0.f &&
         int64_t{p.block_size} * p.num_kv_heads * p.head_dim * 2 < (int64_t{1} << 32);
}

absl::Status PrefillAttentionSm90(const PagedAttentionParams& p, CUstream_st* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.num_seqs == 0 || p.max_query_len == 0) return absl::OkStatus();
  if (p.head_dim == 64) return Launch<64>(p, stream);
  return Launch<128>(p, stream);
}

}  // namespace tessera::kernels::cuda
