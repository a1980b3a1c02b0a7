// GPU sampling, the algorithm of worker/sampling/sampler.cc (see sampling.h).
//
// Grids over 1024-logit chunks of every sampled row first gather the
// row's statistics (RowStats: the largest finite key, whether a NaN or
// +inf is present, the finite count; order-free atomics, so exact) and
// then compute the weights exp(s - max) once (double math, rounded to
// float as the CPU's expf) into the workspace. A group of CTAs per row
// then selects (SampleKernel, RowGroup): CTA `part` scans its own
// contiguous part of the row, and whatever a decision needs from the
// whole row (a digit's bins, the survivors' mass and tie counts before
// each part) is combined over the group through the workspace in part
// order, every CTA reading all the partials and so reaching the same
// decision. Values are compared through an order-preserving uint32 key of
// the float logit (s = logit / T is strictly increasing in the logit, so
// ordering by key is ordering by s). Both thresholds are found digit by
// digit, 8 bits a pass from the top: the k-th largest key (top-k) from
// integer histograms, the last key kept by top-p from the bins' weight
// masses (BinMasses: summed per warp in a fixed order, then over the warps
// in warp order, then over the group's CTAs in part order, so the result
// is deterministic); the bin a level descends into comes from the bins'
// suffix sums (one block scan, then a block maximum). The first level's
// bins sum to top-p's total, and the last level's bin is last_key itself,
// whose mass over its one weight is its tie count. One more pass over the
// row then gives each thread its survivors' weight and ties in id order
// (contiguous per-thread chunks), scanned over the CTA and the group; the
// thread whose range holds u x total walks it. The lowest chosen id and
// the last survivor (the CPU's fallback) are published with order-free
// atomics; the last CTA of the group to publish reports the token. A
// greedy row takes one pass (validation and the argmax) and one combine.
//
// The group has up to 32 CTAs, rows x group at most 256, no part shorter
// than 4096 ids, and never more CTAs than the device holds at once: the
// CTAs of a group wait for each other at every combine (an arrival
// counter per row; a CTA that waits more than 4 s goes on, marks the row
// poisoned, and the row gives -1 instead of hanging). The passes issue the
// loads of 8 to 16 elements per thread before using any (Strided /
// Contiguous; 16-byte loads in the contiguous ones), and read a weight
// only for a candidate of the level (or a survivor).
//
// On the H200 (128,256-entry rows, tests/bench/results/cuda_ops_h200.json
// `sample` rows), one row: the first form, one block per row recomputing
// the weights in every pass and searching top-p's key bit by bit (32
// passes), took 0.48 ms with temperature alone, 2.15 ms with top-k 50 +
// top-p 0.9 and 3.54 ms with top-p 0.9 + min-p 0.05; with the weights
// computed once and one block per row selecting, 0.14, 0.48 and 0.94 ms
// (64 rows: 0.28, 0.70, 1.17 ms); with a group of CTAs per row, 0.042,
// 0.125 and 0.117 ms (64 rows, 4 CTAs each: 0.18, 0.40, 0.54 ms). With
// ten passes and combines per top-p row cut to five and six (the
// statistics, the total, the tie count and the CDF's two passes folded
// into the others), weights read only where needed, the bins' choice made
// by the whole CTA and the group's partials loaded eight at a time: 0.022,
// 0.071 and 0.064 ms (64 rows: 0.14, 0.25, 0.34 ms), same run as 0.044,
// 0.123 and 0.116 (0.19, 0.40, 0.53) for the form before; with longer
// chunks for the statistics and weights at many rows, 64 rows 0.13, 0.24
// and 0.33 ms. Tried and not kept (slower on the H200): the final pass in
// coalesced warp ranges (a warp scan per 32 ids, or lane sums with the
// walking warp re-splitting its range), the walk's loads batched, parts of
// at least 8192 ids, and one CTA per SM without spilled registers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/per_device.cuh"
#include "kernels/cuda/sampling.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads >= 256, "top-p sums one radix bin per thread");
// The statistics and weights kernels: CTAs of kWeightThreads over chunks
// of a multiple of kWeightChunk logits, so that a row's exponentials spread
// over the GPU; with many rows, longer chunks (about kWeightCtas CTAs in
// all: at 64 rows of 128,256 the two kernels took 15 and 37 µs on the
// H200 against 21 and 43 with 1024-logit chunks).
constexpr int kWeightThreads = 256;
constexpr int64_t kWeightChunk = 1024;
constexpr int64_t kWeightCtas = 2048;
constexpr float kGreedyTemperature = 1e-5f;  // worker/sampling/sampling_params.h
// The selection's CTAs per row (SampleKernel's group): up to kMaxGroup,
// with rows * group at most kGroupBudget (the workspace's slots are sized
// for that), and no more than the device holds at once (the group's CTAs
// wait for each other).
constexpr int kMaxGroup = 32;
constexpr int kGroupBudget = 256;
constexpr int64_t kMinPart = 4096;
constexpr int kSlotBytes = 256 * sizeof(double);  // one CTA's partial of one combine
constexpr uint64_t kGroupTimeoutNs = 4000000000ull;
constexpr uint32_t kNegInfKey = 0x007fffffu;  // Key(-inf); finite keys are larger

__device__ __forceinline__ uint32_t Key(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float FromKey(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(u);
}

// Philox4x32-10 and UniformFromSeed, bit-identical to worker/sampling/philox.cc.
__device__ double UniformFromSeed(uint64_t seed, uint64_t position, uint32_t stream) {
  uint32_t c0 = static_cast<uint32_t>(position), c1 = static_cast<uint32_t>(position >> 32),
           c2 = stream, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  const uint64_t mantissa = (static_cast<uint64_t>(c0) << 21) | (c1 >> 11);
  return static_cast<double>(mantissa) * 0x1p-53;
}

__device__ __forceinline__ uint32_t AcquireLoad(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A value of type T from L2 (not L1, which may hold an older level's
// slot), read as 32-bit words.
template <class T>
__device__ __forceinline__ T LoadCg(const T* p) {
  static_assert(sizeof(T) % 4 == 0 && std::is_trivially_copyable_v<T>);
  uint32_t words[sizeof(T) / 4];
#pragma unroll
  for (size_t i = 0; i < sizeof(T) / 4; ++i) {
    words[i] = __ldcg(reinterpret_cast<const unsigned int*>(p) + i);
  }
  T v;
  memcpy(&v, words, sizeof(T));
  return v;
}

struct RowState {
  double inv_t_denominator;  // temperature as double (s = logit / temperature)
  double max_s;
};

// The CPU's w[t] = std::exp(static_cast<float>(s[t] - max_logit)): glibc's
// expf is correctly rounded in practice, which exp in double then rounding
// to float reproduces.
__device__ __forceinline__ float Weight(float logit, const RowState& st) {
  const double s = static_cast<double>(logit) / st.inv_t_denominator;
  const float d = static_cast<float>(s - st.max_s);
  return static_cast<float>(exp(static_cast<double>(d)));
}

// A sampled row's state, from its largest finite key (RowStats).
__device__ __forceinline__ RowState StateFor(const RowSamplingParams& p, uint32_t max_key) {
  RowState st;
  st.inv_t_denominator = static_cast<double>(p.temperature);
  st.max_s = static_cast<double>(FromKey(max_key)) / st.inv_t_denominator;
  return st;
}

// The row passes: f(i, logit) for i = begin + tid, begin + tid +
// blockDim.x, ... below end (Strided) or f(i, logit, weight) for i = begin
// .. end - 1 (Contiguous), in that order, with the loads of kLoads (kAhead)
// elements issued before any is used, so a thread has that many in flight
// instead of one L2 round trip per element. The order of f's calls is the
// plain loop's, so sums come out bitwise the same.
constexpr int kAhead = 16;

template <int kLoads = kAhead, class F>
__device__ __forceinline__ void Strided(const float* x, int64_t begin, int64_t end, F&& f) {
  const int64_t step = blockDim.x;
  for (int64_t i0 = begin + threadIdx.x; i0 < end; i0 += kLoads * step) {
    float xv[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t i = i0 + j * step;
      xv[j] = i < end ? __ldg(x + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (i0 + j * step < end) f(i0 + j * step, xv[j]);
    }
  }
}

// Contiguous: f(i, logit, weight) for i = begin .. end - 1 in order, the
// weight loaded only where need(logit) (0 elsewhere): a warp's lanes read
// addresses a chunk apart, so every load instruction touches 32 lines;
// with `vec` (16-byte aligned x + begin) the logits go as 16-byte loads, a
// quarter of the instructions.
template <class Need, class F>
__device__ __forceinline__ void Contiguous(const float* x, const float* w, int64_t begin,
                                           int64_t end, bool vec, Need&& need, F&& f) {
  constexpr int kAhead = 8;  // (16 here makes the kernel spill registers)
  for (int64_t i0 = begin; i0 < end; i0 += kAhead) {
    float xv[kAhead], wv[kAhead];
    if (vec && i0 + kAhead <= end) {
#pragma unroll
      for (int j = 0; j < kAhead; j += 4) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(x + i0 + j));
        xv[j] = a.x, xv[j + 1] = a.y, xv[j + 2] = a.z, xv[j + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kAhead; ++j) xv[j] = i0 + j < end ? __ldg(x + i0 + j) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      wv[j] = i0 + j < end && need(xv[j]) ? __ldg(w + i0 + j) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (i0 + j < end) f(i0 + j, xv[j], wv[j]);
    }
  }
}

// Top-p's radix level: warp_bins[w][b] = the weight of the candidates (key
// >= kth_key) whose key has the top bits `prefix` (under `mask`) and digit
// b at `shift`, summed by warp w over its elements i = tid + j * blockDim.x
// in increasing j; within one pass of the warp, lanes with the same digit
// are summed in lane order. A fixed order: the masses are deterministic.
__device__ __forceinline__ void BinMasses(const float* x, const float* w, int64_t n,
                                          uint32_t kth_key, uint32_t prefix, uint32_t mask,
                                          int shift, double (*warp_bins)[256]) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int b = lane; b < 256; b += 32) warp_bins[warp][b] = 0.0;
  __syncwarp();
  const int64_t step = blockDim.x;
  for (int64_t i0 = threadIdx.x - lane; i0 < n; i0 += kAhead * step) {  // warp-uniform
    uint32_t keys[kAhead];
    float ws[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t i = i0 + j * step + lane;
      keys[j] = i < n ? Key(__ldg(x + i)) : 0u;
    }
    // Weights only for the bracket's candidates (below the first level,
    // a small part of the row).
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t i = i0 + j * step + lane;
      ws[j] = i < n && keys[j] >= kth_key && (keys[j] & mask) == prefix ? __ldg(w + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const bool in = keys[j] >= kth_key && (keys[j] & mask) == prefix;
      if (__ballot_sync(0xffffffffu, in) == 0) continue;  // warp-uniform
      const uint32_t bin = in ? (keys[j] >> shift) & 255u : 256u;
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      const double v = in ? static_cast<double>(ws[j]) : 0.0;
      // Each lane sums its peers' values in ascending lane order, as many
      // rounds as the warp's largest group of peers.
      const int rounds = __reduce_max_sync(0xffffffffu, in ? __popc(peers) : 0);
      double sum = 0.0;
      uint32_t rest = in ? peers : 0u;
      for (int k = 0; k < rounds; ++k) {
        const double other = __shfl_sync(0xffffffffu, v, rest != 0 ? __ffs(rest) - 1 : lane);
        if (rest != 0) {
          sum += other;
          rest &= rest - 1;
        }
      }
      if (in && lane == __ffs(peers) - 1) warp_bins[warp][bin] += sum;
      __syncwarp();
    }
  }
  __syncthreads();
}

// Parameters inside ValidateSamplingParams' ranges (a row outside gets -1).
__device__ __forceinline__ bool ParamsValid(const RowSamplingParams& p) {
  return p.temperature >= 0.0f && p.top_p > 0.0f && p.top_p <= 1.0f && p.min_p >= 0.0f &&
         p.min_p <= 1.0f && p.position >= 0;
}

// Rows whose weights the sampling kernel reads: valid sampled rows (greedy
// rows and bad parameters never look at them).
__device__ __forceinline__ bool NeedsWeights(const RowSamplingParams& p) {
  return ParamsValid(p) && p.temperature >= kGreedyTemperature;
}

// Workspace: the rows' statistics, the rows' group arrival counters, the
// rows' picks, the groups' slots, then the rows' weights.
struct Workspace {
  uint32_t* stats;            // [rows][4]: see RowStat
  uint32_t* arrive;           // [rows][2]: arrivals, poisoned (a CTA gave up waiting)
  unsigned long long* picks;  // [rows][2]: lowest chosen id (~0: none), last survivor + 1
  unsigned char* slots;       // [rows][2][GroupSlots(rows, vocab)][kSlotBytes]
  float* weights;             // [rows, vocab]
};
// A sampled row's statistics (RowStats; order-free atomics, so exact):
enum RowStat {
  kMaxKey = 0,  // the largest finite key (0: no finite logit)
  kBad = 1,     // a NaN or +inf logit
  kFinite = 2,  // finite logits
  kDone = 3,    // the group's CTAs that have published their picks
};

size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }
size_t StatsBytes(int64_t rows) { return Round256(static_cast<size_t>(rows) * 16); }
size_t ArriveBytes(int64_t rows) { return Round256(static_cast<size_t>(rows) * 8); }
size_t PicksBytes(int64_t rows) { return Round256(static_cast<size_t>(rows) * 16); }
// The CTAs per row the workspace has slots for: at most kMaxGroup, rows x
// group at most kGroupBudget, and no part shorter than kMinPart ids.
int GroupSlots(int64_t rows, int64_t vocab) {
  const int64_t by_rows = kGroupBudget / std::max<int64_t>(rows, 1);
  const int64_t by_vocab = vocab / kMinPart;
  return static_cast<int>(std::clamp<int64_t>(std::min(by_rows, by_vocab), 1, kMaxGroup));
}
// Slots only where a row may have more than one CTA (at most 1 MB).
size_t SlotBytes(int64_t rows, int64_t vocab) {
  const int group = GroupSlots(rows, vocab);
  return group > 1 ? static_cast<size_t>(rows) * 2 * static_cast<size_t>(group) * kSlotBytes : 0;
}

__global__ void ClearRowState(uint32_t* stats, uint32_t* arrive, unsigned long long* picks,
                              int64_t rows) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) {
    for (int i = 0; i < 4; ++i) stats[4 * r + i] = 0;
    arrive[2 * r] = 0;
    arrive[2 * r + 1] = 0;
    picks[2 * r] = ~0ull;
    picks[2 * r + 1] = 0;
  }
}

// Grid (chunks, rows): each CTA adds its chunk of a sampled row to the
// row's statistics (the largest finite key, NaN / +inf, the finite count).
__global__ void __launch_bounds__(kWeightThreads)
    RowStats(const float* __restrict__ logits, int64_t vocab, int64_t chunk,
             const RowSamplingParams* __restrict__ params, uint32_t* __restrict__ stats) {
  __shared__ uint32_t scratch[32];
  __shared__ int iscratch[32];
  const int64_t row = blockIdx.y;
  if (!NeedsWeights(params[row])) return;
  const float* x = logits + row * vocab;
  const int64_t begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  uint32_t best = 0;
  int finite = 0, bad = 0;
  Strided<8>(x, begin, end, [&](int64_t, float v) {
    if (isfinite(v)) {
      best = max(best, Key(v));
      ++finite;
    } else if (isnan(v) || v > 0.0f) {
      bad = 1;
    }
  });
  best = BlockMax(best, scratch, 0u);
  finite = BlockSum(finite, iscratch);
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    uint32_t* st = stats + 4 * row;
    if (best != 0) atomicMax(st + kMaxKey, best);
    if (finite != 0) atomicAdd(st + kFinite, static_cast<uint32_t>(finite));
    if (bad) atomicOr(st + kBad, 1u);
  }
}

// Grid (chunks, rows): weights[i] = Weight(logit i) for the finite logits
// (0 otherwise), with the row's max from RowStats.
__global__ void __launch_bounds__(kWeightThreads)
    RowWeights(const float* __restrict__ logits, int64_t vocab, int64_t chunk,
               const RowSamplingParams* __restrict__ params, const uint32_t* __restrict__ stats,
               float* __restrict__ weights) {
  const int64_t row = blockIdx.y;
  const RowSamplingParams p = params[row];
  const uint32_t max_key = stats[4 * row + kMaxKey];
  if (!NeedsWeights(p) || max_key == 0) return;
  const RowState st = StateFor(p, max_key);
  const float* x = logits + row * vocab;
  float* w = weights + row * vocab;
  const int64_t begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  Strided<8>(x, begin, end, [&](int64_t i, float v) { w[i] = isfinite(v) ? Weight(v, st) : 0.0f; });
}

// The CTAs that select one row's token (SampleKernel's group): CTA `part`
// of `parts` covers ids [begin, end) of the row. Values are combined over
// the group through slots in the workspace, in part order (deterministic):
// every CTA writes its partial into its slot of the current level, all
// wait at the row's arrival counter, and every CTA reads all the partials
// and so reaches the same decisions. Levels alternate between two sets of
// slots; a CTA writes level L + 2 only after all have arrived at L + 1,
// that is after all have read level L.
struct RowGroup {
  int part, parts;
  int64_t begin, end;
  uint32_t* arrive;      // the row's counter and poison word (zeroed by ClearRowState)
  unsigned char* slots;  // the row's [2][stride] slots of kSlotBytes
  int stride;
  int level;
  bool timed_out;

  __device__ unsigned char* Slot(int p) const {
    return slots + (static_cast<int64_t>(level & 1) * stride + p) * kSlotBytes;
  }
  // Every CTA of the group has written its slot of this level.
  __device__ void Arrive() {
    __syncthreads();
    if (parts > 1 && threadIdx.x == 0) {
      __threadfence();
      const uint32_t target = static_cast<uint32_t>(level + 1) * static_cast<uint32_t>(parts);
      atomicAdd(arrive, 1u);
      const uint64_t start = GlobalTimerNs();
      while (AcquireLoad(arrive) < target && !timed_out) {
        timed_out = GlobalTimerNs() - start > kGroupTimeoutNs;
      }
      // A CTA that gave up goes on with what it has; the row is poisoned,
      // and part 0 reports -1 for it (it waits for this CTA's later
      // arrivals, or gave up itself).
      if (timed_out) atomicOr(arrive + 1, 1u);
      __threadfence();
    }
    __syncthreads();
  }
  template <class T>
  __device__ T Read(int p, int i) const {
    return LoadCg(reinterpret_cast<const T*>(Slot(p)) + i);
  }
  // Each CTA's `mine` (the same in every thread of the CTA) folded over the
  // group in part order: the first part's value, then fold(acc, part p's
  // value, p) for p = 1, 2, ... Every CTA gets the same result.
  template <class T, class F>
  __device__ T Combine(const T& mine, F&& fold) {
    if (parts == 1) return mine;
    if (threadIdx.x == 0) *reinterpret_cast<T*>(Slot(part)) = mine;
    Arrive();
    T acc;
    ForEachPart<T>(0, [&](const T& v, int p) {
      if (p == 0) {
        acc = v;
      } else {
        fold(acc, v, p);
      }
    });
    ++level;
    return acc;
  }
  // f(part p's value at index i of its slot, p) for p = 0, 1, ...: the
  // loads of kBatch parts issued before any is used (one L2 round trip per
  // batch instead of per part).
  template <class T, class F>
  __device__ void ForEachPart(int i, F&& f) const {
    constexpr int kBatch = sizeof(T) <= 8 ? 8 : 2;
    for (int p0 = 0; p0 < parts; p0 += kBatch) {
      T v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (p0 + j < parts) v[j] = Read<T>(p0 + j, i);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (p0 + j < parts) f(v[j], p0 + j);
      }
    }
  }
  // The group's sum of one value per CTA, in part order; *prefix (optional)
  // gets the sum over the parts before this one.
  template <class T>
  __device__ T Sum(T v, T* prefix = nullptr) {
    T before{};
    const T total = Combine(v, [&](T& acc, T next, int p) {
      if (p == part) before = acc;
      acc += next;
    });
    if (prefix != nullptr) *prefix = before;
    return total;
  }
  // 256 per-CTA bins (thread b < 256 holds bin b) summed over the group in
  // part order into bins[b].
  template <class T>
  __device__ void SumBins(T* bins) {
    if (parts == 1) return;
    if (threadIdx.x < 256) reinterpret_cast<T*>(Slot(part))[threadIdx.x] = bins[threadIdx.x];
    Arrive();
    if (threadIdx.x < 256) {
      T total;
      ForEachPart<T>(threadIdx.x, [&](const T& v, int p) {
        if (p == 0) {
          total = v;
        } else {
          total += v;
        }
      });
      bins[threadIdx.x] = total;
    }
    ++level;
    __syncthreads();
  }
};

// The radix levels' choice of a bin, over 256 bins (bins[b], shared):
// suffix[b] = bins[b] + bins[b + 1] + ... + bins[255], summed once in a
// fixed order (a block scan) into shared memory, with suffix[256] = 0.
// All threads of the CTA call both.
template <class T>
__device__ __forceinline__ void SuffixSums(const T* bins, T* suffix, T* scratch) {
  const int t = threadIdx.x;  // thread t holds bin 255 - t
  const T v = t < 256 ? bins[255 - t] : T(0);
  const T before = BlockExclusiveScan(v, scratch, static_cast<T*>(nullptr));
  if (t < 256) suffix[255 - t] = before + v;
  if (t == 0) suffix[256] = T(0);
  __syncthreads();
}
// The highest bin b >= 1 with base + suffix[b] >= goal, else 0; *above =
// base + suffix[b + 1] (so base + suffix[b + 1] < goal whenever base <
// goal, exactly as compared).
template <class T>
__device__ __forceinline__ int HighestReaching(const T* suffix, T base, T goal, int* scratch,
                                               T* above) {
  const int b = 255 - static_cast<int>(threadIdx.x);
  const int mine = b >= 1 && base + suffix[b] >= goal ? b : 0;
  const int found = BlockMax(mine, scratch, 0);
  *above = base + suffix[found + 1];
  return found;
}

// The greedy pass's findings, combined over the group.
struct GreedyPass {
  int bad, finite;
  ValueIndex best;
};

// What the final pass sums over the group: the survivors' weight other
// than top-p's ties at last_key, and the number of those ties.
struct MassTies {
  double mass;
  int64_t ties;
  __device__ MassTies& operator+=(const MassTies& o) {
    mass += o.mass;
    ties += o.ties;
    return *this;
  }
};

__global__ void __launch_bounds__(kThreads, 2)
    SampleKernel(const float* __restrict__ logits, int64_t vocab,
                 const RowSamplingParams* __restrict__ params, const float* __restrict__ weights,
                 int32_t* __restrict__ out, uint32_t* __restrict__ stats,
                 uint32_t* __restrict__ arrive, unsigned long long* __restrict__ picks,
                 unsigned char* __restrict__ slots, int slot_stride) {
  __shared__ int iscratch[33];
  __shared__ int64_t lscratch[33];
  __shared__ double dscratch[33];
  __shared__ ValueIndex vscratch[32];
  __shared__ unsigned long long chosen;
  __shared__ int hist[256];
  __shared__ int count_suffix[257];
  __shared__ double warp_bins[kThreads / 32][256];  // top-p: per-warp bin masses
  __shared__ double mass_suffix[257];

  const int64_t row = blockIdx.y;
  RowGroup grp;
  grp.part = blockIdx.x;
  grp.parts = gridDim.x;
  // Parts of a multiple of 4 ids: with vocab % 4 == 0 every part (and the
  // per-thread chunks below) starts 16-byte aligned.
  const int64_t span = ((vocab + grp.parts - 1) / grp.parts + 3) / 4 * 4;
  grp.begin = min(vocab, grp.part * span);
  grp.end = min(vocab, grp.begin + span);
  grp.arrive = arrive + 2 * row;
  grp.slots = slots + row * 2 * static_cast<int64_t>(slot_stride) * kSlotBytes;
  grp.stride = slot_stride;
  grp.level = 0;
  grp.timed_out = false;
  const int64_t n = grp.end - grp.begin;
  const float* x = logits + row * vocab + grp.begin;   // this CTA's ids
  const float* w = weights + row * vocab + grp.begin;  // Weight(x[i]) for finite x[i]
  const RowSamplingParams p = params[row];
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  // A decision every CTA of the group reached: part 0 reports it.
  auto finish = [&](int64_t token) {
    if (grp.part == 0 && tid == 0) {
      const bool poisoned = grp.timed_out || AcquireLoad(grp.arrive + 1) != 0;
      out[row] = poisoned ? -1 : static_cast<int32_t>(token);
    }
  };
  if (!ParamsValid(p)) {
    finish(-1);
    return;
  }

  if (p.temperature < kGreedyTemperature) {
    // Greedy: validation and the argmax (lowest id among ties) in one pass.
    int bad = 0, finite = 0;
    ValueIndex best{-__int_as_float(0x7f800000), INT64_MAX};
    Strided(x, 0, n, [&](int64_t i, float v) {
      if (isnan(v) || v == __int_as_float(0x7f800000)) bad = 1;
      if (isfinite(v)) ++finite;
      const ValueIndex c{v, grp.begin + i};
      if (Better(c, best)) best = c;
    });
    GreedyPass g;
    g.bad = __syncthreads_or(bad);
    g.finite = BlockSum(finite, iscratch);
    g.best = BlockArgmax(best, vscratch);
    g = grp.Combine(g, [](GreedyPass& all, const GreedyPass& f, int) {
      all.bad |= f.bad;
      all.finite += f.finite;
      if (Better(f.best, all.best)) all.best = f.best;
    });
    finish(g.bad || g.finite == 0 ? -1 : g.best.index);
    return;
  }

  // A sampled row: RowStats found its largest finite key, whether it has a
  // NaN or +inf logit, and its finite count.
  const uint32_t* row_stats = stats + 4 * row;
  const uint32_t max_key = row_stats[kMaxKey];
  const int64_t n_finite = row_stats[kFinite];
  if (row_stats[kBad] != 0 || n_finite == 0) {
    finish(-1);
    return;
  }
  const RowState st = StateFor(p, max_key);

  // Step 4: top-k -> kth_key = the k-th largest finite key, by an 8-bit
  // radix select from the top digit (integer histograms: deterministic).
  uint32_t kth_key = kNegInfKey + 1;  // every finite key
  const bool top_k = p.top_k > 0 && static_cast<int64_t>(p.top_k) < n_finite;
  if (top_k) {
    uint32_t prefix = 0, mask = 0;
    int remaining = p.top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += nthreads) hist[b] = 0;
      __syncthreads();
      Strided(x, 0, n, [&](int64_t, float v) {
        const uint32_t key = Key(v);
        if (key > kNegInfKey && (key & mask) == prefix) {
          // One atomic per distinct bin of the warp: logits crowd into a
          // few bins, and per-lane atomics on them serialize.
          const uint32_t bin = (key >> shift) & 255u;
          const uint32_t peers = __match_any_sync(__activemask(), bin);
          if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
      });
      __syncthreads();
      grp.SumBins(hist);
      // The k-th largest lies in the highest bin b whose count with the
      // bins above it reaches `remaining`.
      SuffixSums(hist, count_suffix, iscratch);
      int above = 0;
      const int b = HighestReaching(count_suffix, 0, remaining, iscratch, &above);
      prefix |= static_cast<uint32_t>(b) << shift;
      remaining -= above;
      mask |= 255u << shift;
      __syncthreads();  // hist and count_suffix are rewritten at the next level
    }
    kth_key = prefix;
  }
  // Candidates: finite and key >= kth_key (kth_key > kNegInfKey).

  // Step 5: top-p. f(c) = weight of candidates with key > c, non-increasing;
  // last_key = the smallest key with f < target (target = top_p x the
  // candidates' total weight): everything above it stays, and of its ties
  // (same value, same weight) the first n_keep_ties by id.
  const bool top_p = p.top_p < 1.0f;
  uint32_t last_key = 0;
  float w_last = 0.0f;
  int64_t keep_ties = 0;
  if (top_p) {
    // Radix search, 8 bits a level: with the keys' top bits fixed to
    // `prefix` and `above` = the mass of candidates above that bracket,
    // bin b of the next digit holds the bracket's keys with digit b;
    // g(b) = above + the mass of bins > b is f at the top of bin b, and
    // last_key lies in the lowest bin with g(b) < target (g(255) = above,
    // f(2^32 - 1) = 0 < target). The first level's bins hold every
    // candidate, so their sum is the total.
    uint32_t prefix = 0, mask = 0;
    double target = 0, above = 0, bracket_mass = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      BinMasses(x, w, n, kth_key, prefix, mask, shift, warp_bins);
      // A bin's mass: its warps' masses in warp order, one thread per bin
      // (into warp 0's row; thread b touches only column b), then over the
      // group's CTAs in part order.
      if (tid < 256) {
        double bin = 0;
        for (int wi = 0; wi < kThreads / 32; ++wi) bin += warp_bins[wi][tid];
        warp_bins[0][tid] = bin;
      }
      __syncthreads();
      grp.SumBins(warp_bins[0]);
      SuffixSums(warp_bins[0], mass_suffix, dscratch);
      if (shift == 24) target = static_cast<double>(p.top_p) * mass_suffix[0];
      // g(b) = above + the mass of the bins above b; last_key lies in the
      // highest bin b with g(b - 1) = above + suffix[b] >= target.
      const int lowest = HighestReaching(mass_suffix, above, target, iscratch, &above);
      prefix |= static_cast<uint32_t>(lowest) << shift;
      mask |= 255u << shift;
      bracket_mass = warp_bins[0][lowest];
      __syncthreads();  // warp_bins and mass_suffix are rewritten at the next level
    }
    last_key = prefix;
    w_last = Weight(FromKey(last_key), st);
    // The last level's bracket is last_key itself: its ties all weigh
    // w_last, and a sum of fewer than 2^24 copies of a float is exact in
    // double, so the bracket's mass over w_last counts them exactly. Tie j
    // (0-based, by id) stays while above + j x w_last < target (above <
    // target: the candidates above last_key).
    if (w_last > 0.0f) {
      const int64_t ties = static_cast<int64_t>(bracket_mass / static_cast<double>(w_last));
      const double needed = ceil((target - above) / static_cast<double>(w_last));
      keep_ties = min(ties, static_cast<int64_t>(needed));
    }
  }
  const float min_p = p.min_p;
  // Whether top-p's kept ties survive min-p (they share one weight).
  const bool ties_weigh = w_last > 0.0f && !(min_p > 0.0f && w_last < min_p);
  const int64_t kept = ties_weigh ? keep_ties : 0;

  // Contiguous chunks of the CTA's part from here on (id order matters for
  // ties and the CDF), a multiple of 4 ids each (16-byte loads).
  const int64_t chunk = ((n + nthreads - 1) / nthreads + 3) / 4 * 4;
  const int64_t begin = min(n, tid * chunk);
  const int64_t end = min(n, begin + chunk);
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;

  // Survivor weight (0 when the token does not survive steps 4-6); ties at
  // last_key count their rank in *tie_rank.
  auto survivor_weight = [&](float v, float wi, int64_t* tie_rank) -> float {
    const uint32_t key = Key(v);
    if (key < kth_key) return 0.0f;  // also drops -inf
    if (top_p) {
      if (key < last_key) return 0.0f;
      if (key == last_key) {
        const int64_t rank = (*tie_rank)++;
        if (rank >= keep_ties) return 0.0f;
      }
    }
    if (min_p > 0.0f && wi < min_p) return 0.0f;
    return wi;
  };

  // The final pass: each thread's survivors' weight other than the ties,
  // its ties, its last surviving non-tie and its last tie.
  MassTies mine{0.0, 0};
  int64_t last_other = -1, last_tie = -1;
  // (Weights only for the candidates above last_key: the ties' is w_last.)
  auto needs_weight = [&](float v) {
    const uint32_t key = Key(v);
    return key >= kth_key && (!top_p || key > last_key);
  };
  Contiguous(x, w, begin, end, vec, needs_weight, [&](int64_t i, float v, float wv) {
    if (top_p && Key(v) == last_key) {
      ++mine.ties;
      last_tie = i;
      return;
    }
    int64_t no_ties = 0;
    const float wi = survivor_weight(v, wv, &no_ties);
    if (wi > 0.0f) {
      mine.mass += wi;
      last_other = i;
    }
  });
  // Exclusive prefixes over the CTA, then over the group in part order.
  MassTies block{0.0, 0};
  MassTies before{0.0, 0};
  before.mass = BlockExclusiveScan(mine.mass, dscratch, &block.mass);
  before.ties = BlockExclusiveScan(mine.ties, lscratch, &block.ties);
  MassTies parts_before{0.0, 0};
  const MassTies all = grp.Sum(block, &parts_before);
  before += parts_before;
  // Ties before this thread's chunk, and how many of its own survive.
  const int64_t tie_base = before.ties;
  const int64_t kept_before = min(kept, tie_base);
  const int64_t kept_mine = max(int64_t{0}, min(kept - tie_base, mine.ties));
  const double w_tie = static_cast<double>(w_last);
  // The maximum always survives (weight 1), so total2 >= 1.
  const double total2 = all.mass + static_cast<double>(kept) * w_tie;
  const double prefix = before.mass + static_cast<double>(kept_before) * w_tie;
  const double my_mass = mine.mass + static_cast<double>(kept_mine) * w_tie;

  // The draw: the first survivor in id order whose cumulative weight
  // exceeds u x total2. The thread whose range holds that point walks it;
  // with a slack for rounding (the prefixes are summed in another order
  // than the walk), so a neighbour may walk too, and the lowest id wins.
  if (tid == 0) chosen = ~0ull;
  __syncthreads();
  const double u = UniformFromSeed(p.seed, static_cast<uint64_t>(p.position), /*kSample=*/0);
  const double goal = u * total2;
  const double slack = 1e-12 * total2;
  if (my_mass > 0.0 && goal + slack >= prefix && goal < prefix + my_mass + slack) {
    int64_t rank = tie_base;
    double cumulative = prefix;
    for (int64_t i = begin; i < end; ++i) {  // (one or two threads: a plain walk)
      const float wi = survivor_weight(x[i], w[i], &rank);
      if (wi > 0.0f) {
        cumulative += static_cast<double>(wi);
        if (goal < cumulative) {
          atomicMin(&chosen, static_cast<unsigned long long>(grp.begin + i));
          break;
        }
      }
    }
  }
  // Fallback (u beyond the rounded total): the last survivor, as the CPU.
  // Of this chunk's ties the first kept_mine survive: the last of them is
  // last_tie when all do, else the thread finds it.
  if (kept_mine > 0 && kept_mine < mine.ties) {
    int64_t seen = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (Key(x[i]) == last_key && ++seen == kept_mine) {
        last_tie = i;
        break;
      }
    }
  }
  const int64_t my_last = max(last_other, kept_mine > 0 ? last_tie : int64_t{-1});
  const int64_t block_last =
      BlockMax(my_last >= 0 ? grp.begin + my_last : int64_t{-1}, lscratch, int64_t{-1});
  __syncthreads();
  // Over the group: the lowest chosen id and the last survivor, through
  // order-free atomics; the last CTA to publish its picks reports.
  if (tid == 0) {
    unsigned long long* row_picks = picks + 2 * row;
    int64_t token;
    bool report = true;
    if (grp.parts == 1) {
      token = chosen != ~0ull ? static_cast<int64_t>(chosen) : block_last;
    } else {
      if (chosen != ~0ull) atomicMin(row_picks, chosen);
      if (block_last >= 0)
        atomicMax(row_picks + 1, static_cast<unsigned long long>(block_last + 1));
      __threadfence();
      const uint32_t ticket = atomicAdd(stats + 4 * row + kDone, 1u);
      report = ticket == static_cast<uint32_t>(grp.parts - 1);
      token = -1;
      if (report) {  // every other CTA's picks are in
        __threadfence();
        const unsigned long long c = atomicAdd(row_picks, 0ull);
        const unsigned long long l = atomicAdd(row_picks + 1, 0ull);
        token = c != ~0ull ? static_cast<int64_t>(c) : static_cast<int64_t>(l) - 1;
      }
    }
    if (report) {
      const bool poisoned = grp.timed_out || AcquireLoad(grp.arrive + 1) != 0;
      out[row] = poisoned ? -1 : static_cast<int32_t>(token);
    }
  }
}

}  // namespace

size_t SampleRowsWorkspaceBytes(int64_t rows, int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return StatsBytes(rows) + ArriveBytes(rows) + PicksBytes(rows) + SlotBytes(rows, vocab) +
         static_cast<size_t>(rows) * static_cast<size_t>(vocab) * sizeof(float);
}

namespace {

// SampleKernel CTAs the current device holds at once (0 when unknown).
int ResidentSampleCtas() {
  static PerDevice<int> resident;
  const int* v = resident.Current([](int& ctas, int dev) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SampleKernel, kThreads, 0) !=
            cudaSuccess) {
      cudaGetLastError();
      ctas = 0;
      return;
    }
    ctas = sms * per_sm;
  });
  return v != nullptr ? *v : 0;
}

}  // namespace

absl::Status SampleRows(const float* logits, int64_t rows, int64_t vocab,
                        const RowSamplingParams* params, int32_t* out, void* workspace,
                        size_t workspace_bytes, CudaStream stream) {
  if (rows < 0 || vocab <= 0 || rows > 65535 || vocab > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: bad shape rows=", rows,
                                                   " vocab=", vocab,
                                                   " (rows at most 65535, vocab at most 2^24)"));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || out == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError("SampleRows: null pointer");
  }
  if (workspace_bytes < SampleRowsWorkspaceBytes(rows, vocab) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleRows: workspace of ", workspace_bytes, " bytes (",
                     SampleRowsWorkspaceBytes(rows, vocab), " needed, 16-byte aligned)"));
  }
  Workspace ws;
  char* base = static_cast<char*>(workspace);
  ws.stats = reinterpret_cast<uint32_t*>(base);
  base += StatsBytes(rows);
  ws.arrive = reinterpret_cast<uint32_t*>(base);
  base += ArriveBytes(rows);
  ws.picks = reinterpret_cast<unsigned long long*>(base);
  base += PicksBytes(rows);
  ws.slots = reinterpret_cast<unsigned char*>(base);
  base += SlotBytes(rows, vocab);
  ws.weights = reinterpret_cast<float*>(base);
  // The group: as many CTAs per row as the slots allow and the device
  // holds at once for all rows (they wait for each other).
  const int slots_per_row = GroupSlots(rows, vocab);
  const int group = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(slots_per_row, ResidentSampleCtas() / rows)));
  const cudaStream_t s = AsCuda(stream);
  // The statistics and weights: chunks of at least kWeightChunk logits,
  // longer when there are many rows (about kWeightCtas CTAs in all).
  const int64_t per_cta = (rows * vocab + kWeightCtas - 1) / kWeightCtas;
  const int64_t chunk =
      std::clamp<int64_t>((per_cta + kWeightChunk - 1) / kWeightChunk, 1, 16) * kWeightChunk;
  const dim3 grid(static_cast<unsigned>((vocab + chunk - 1) / chunk), static_cast<unsigned>(rows));
  ClearRowState<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, s>>>(ws.stats, ws.arrive,
                                                                          ws.picks, rows);
  RowStats<<<grid, kWeightThreads, 0, s>>>(logits, vocab, chunk, params, ws.stats);
  RowWeights<<<grid, kWeightThreads, 0, s>>>(logits, vocab, chunk, params, ws.stats, ws.weights);
  SampleKernel<<<dim3(static_cast<unsigned>(group), static_cast<unsigned>(rows)), kThreads, 0, s>>>(
      logits, vocab, params, ws.weights, out, ws.stats, ws.arrive, ws.picks, ws.slots,
      slots_per_row);
  return CheckLastLaunch("SampleRows");
}

}  // namespace tessera::kernels::cuda
