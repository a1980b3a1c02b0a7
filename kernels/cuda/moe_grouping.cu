// Grouping of (token, slot) pairs by expert (moe_grouping.h). No atomics:
// the result is deterministic.
//
// Up to kSmallPairs pairs and experts (decode steps): one CTA, one launch
// (a launch boundary costs about as much as the whole grouping there).
// Thread p ranks pair p among the earlier pairs of its expert and thread e
// counts expert e, both by a pass over the ids in shared memory (broadcast
// reads); block scans give the offsets, tile starts and active slots.
//
// Above: two launches of one CTA per local expert. The first counts each
// expert's pairs (and clears pair_row), the second derives the expert's
// offsets from all counts and writes its rows with a block-wide scan over
// the pairs, which keeps them in pair order. Each CTA reads all T*k ids; at
// T = 4096, k = 8 that is 128 KiB from L2 per CTA, a few microseconds in
// all.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 4;  // pairs per thread per scan step

struct GroupArgs {
  const int32_t* ids;
  int32_t pairs;  // T * k
  int32_t first_expert;
  MoeGroups g;
};

__global__ void __launch_bounds__(kThreads) CountKernel(GroupArgs a) {
  __shared__ int32_t red[32];
  const int32_t expert = a.first_expert + static_cast<int32_t>(blockIdx.x);
  int32_t count = 0;
  for (int32_t p = threadIdx.x; p < a.pairs; p += kThreads) count += a.ids[p] == expert;
  for (int32_t p = blockIdx.x * kThreads + threadIdx.x; p < a.pairs; p += gridDim.x * kThreads) {
    a.g.pair_row[p] = -1;
  }
  count = BlockSum(count, red);
  if (threadIdx.x == 0) a.g.counts[blockIdx.x] = count;
}

// Writes this CTA's expert's offset, tile start and active slot (and, from
// the last CTA, the totals). Returns the expert's first row.
__device__ int32_t WriteExpertHeader(const MoeGroups& g, int32_t count, int32_t* red) {
  const int e = static_cast<int>(blockIdx.x);
  int32_t rows = 0, tiles = 0, active = 0;
  for (int i = threadIdx.x; i < e; i += kThreads) {
    const int32_t c = g.counts[i];
    rows += c;
    tiles += (c + kMoeGroupTileRows - 1) / kMoeGroupTileRows;
    active += c > 0;
  }
  rows = BlockSum(rows, red);
  tiles = BlockSum(tiles, red);
  active = BlockSum(active, red);
  if (threadIdx.x == 0) {
    const int32_t my_tiles = (count + kMoeGroupTileRows - 1) / kMoeGroupTileRows;
    g.offsets[e] = rows;
    g.tile_start[e] = tiles;
    if (count > 0) g.active[1 + active] = e;
    if (e + 1 == g.num_experts) {
      g.offsets[e + 1] = rows + count;
      g.tile_start[e + 1] = tiles + my_tiles;
      g.active[0] = active + (count > 0);
    }
  }
  return rows;
}

__global__ void __launch_bounds__(kThreads) PlaceKernel(GroupArgs a) {
  __shared__ int32_t red[33];
  const int32_t count = a.g.counts[blockIdx.x];
  const int32_t first_row = WriteExpertHeader(a.g, count, red);
  if (count == 0) return;
  const int32_t expert = a.first_expert + static_cast<int32_t>(blockIdx.x);
  int32_t placed = 0;
  for (int32_t base = 0; base < a.pairs; base += kThreads * kItems) {
    const int32_t p0 = base + threadIdx.x * kItems;
    bool mine[kItems];
    int32_t n = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      mine[i] = p0 + i < a.pairs && a.ids[p0 + i] == expert;
      n += mine[i];
    }
    int32_t step_total = 0;
    int32_t row = first_row + placed + BlockExclusiveScan(n, red, &step_total);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!mine[i]) continue;
      a.g.row_token[row] = (p0 + i) / a.g.top_k;
      a.g.pair_row[p0 + i] = row;
      ++row;
    }
    placed += step_total;
  }
}

constexpr int kSmallPairs = 1024;  // also the small kernel's threads

// The whole grouping in one CTA of kSmallPairs threads; pairs and
// num_experts <= kSmallPairs.
__global__ void __launch_bounds__(kSmallPairs) SmallGroupKernel(GroupArgs a) {
  __shared__ int32_t local[kSmallPairs];  // local expert of each pair, -1 if not held
  __shared__ int32_t first_row[kSmallPairs];
  __shared__ int32_t scan[33];
  const int t = threadIdx.x;
  const MoeGroups& g = a.g;
  const int32_t id = t < a.pairs ? a.ids[t] - a.first_expert : -1;
  local[t] = id >= 0 && id < g.num_experts ? id : -1;
  __syncthreads();
  int32_t count = 0, rank = 0;
  for (int q = 0; q < a.pairs; ++q) {
    const int32_t e = local[q];
    count += e == t;
    rank += q < t && e == local[t];
  }
  if (t >= g.num_experts) count = 0;
  int32_t rows = 0, tiles = 0, active = 0;
  const int32_t start = BlockExclusiveScan(count, scan, &rows);
  const int32_t my_tiles = (count + kMoeGroupTileRows - 1) / kMoeGroupTileRows;
  const int32_t tile0 = BlockExclusiveScan(my_tiles, scan, &tiles);
  const int32_t slot = BlockExclusiveScan(static_cast<int32_t>(count > 0), scan, &active);
  if (t < g.num_experts) {
    g.counts[t] = count;
    g.offsets[t] = start;
    g.tile_start[t] = tile0;
    first_row[t] = start;
    if (count > 0) g.active[1 + slot] = t;
  }
  if (t == 0) {
    g.offsets[g.num_experts] = rows;
    g.tile_start[g.num_experts] = tiles;
    g.active[0] = active;
  }
  __syncthreads();
  if (t >= a.pairs) return;
  const int32_t e = local[t];
  const int32_t row = e >= 0 ? first_row[e] + rank : -1;
  g.pair_row[t] = row;
  if (row >= 0) g.row_token[row] = t / g.top_k;
}

}  // namespace

int64_t MoeGroupsInts(int64_t max_tokens, int top_k, int num_experts) {
  const int64_t pairs = max_tokens * top_k;
  return 3 * static_cast<int64_t>(num_experts) + 2 + 1 + std::min<int64_t>(num_experts, pairs) +
         2 * pairs;
}

MoeGroups CarveMoeGroups(int32_t* base, int64_t max_tokens, int top_k, int num_experts) {
  const int64_t pairs = max_tokens * top_k;
  MoeGroups g;
  g.max_tokens = max_tokens;
  g.top_k = top_k;
  g.num_experts = num_experts;
  g.offsets = base;
  g.tile_start = g.offsets + num_experts + 1;
  g.counts = g.tile_start + num_experts + 1;
  g.active = g.counts + num_experts;
  g.row_token = g.active + 1 + std::min<int64_t>(num_experts, pairs);
  g.pair_row = g.row_token + pairs;
  return g;
}

int64_t MoeMaxGemmTiles(int64_t num_tokens, int top_k, int num_experts) {
  const int64_t pairs = num_tokens * top_k;
  return (pairs + kMoeGroupTileRows - 1) / kMoeGroupTileRows +
         std::min<int64_t>(num_experts, pairs);
}

int64_t MoeMaxActiveExperts(int64_t num_tokens, int top_k, int num_experts) {
  return std::min<int64_t>(num_experts, num_tokens * top_k);
}

absl::Status MoeGroupByExpert(const int32_t* ids, int64_t num_tokens, int32_t first_expert,
                              const MoeGroups& g, CudaStream stream) {
  if (g.num_experts < 1 || g.top_k < 1 || g.max_tokens < 0 || g.max_tokens * g.top_k > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MoeGroupByExpert: bad groups (experts ",
                                                   g.num_experts, ", top_k ", g.top_k,
                                                   ", max_tokens ", g.max_tokens, ")"));
  }
  if (num_tokens < 0 || num_tokens > g.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("MoeGroupByExpert: num_tokens = ", num_tokens,
                                                   " outside [0, ", g.max_tokens, "]"));
  }
  if ((num_tokens > 0 && ids == nullptr) || g.offsets == nullptr) {
    return absl::InvalidArgumentError("MoeGroupByExpert: null pointer");
  }
  // Launched even for zero tokens: the offsets and the active count must
  // say "no rows" for the expert kernels that follow.
  const GroupArgs args{ids, static_cast<int32_t>(num_tokens * g.top_k), first_expert, g};
  if (args.pairs <= kSmallPairs && g.num_experts <= kSmallPairs) {
    SmallGroupKernel<<<1, kSmallPairs, 0, AsCuda(stream)>>>(args);
    return CheckLastLaunch("MoeGroupByExpert");
  }
  CountKernel<<<g.num_experts, kThreads, 0, AsCuda(stream)>>>(args);
  if (absl::Status s = CheckLastLaunch("MoeGroupByExpert count"); !s.ok()) return s;
  PlaceKernel<<<g.num_experts, kThreads, 0, AsCuda(stream)>>>(args);
  return CheckLastLaunch("MoeGroupByExpert place");
}

}  // namespace tessera::kernels::cuda
