// GPU sampling, the algorithm of worker/sampling/sampler.cc (see sampling.h).
//
// The weights exp(s - max) (double math, rounded to float as the CPU's
// expf) are computed once by grids over 1024-logit chunks of every sampled
// row: the row's largest finite key (atomicMax: order-free), then the
// weights into the workspace. A group of CTAs per row then selects
// (SampleKernel, RowGroup): CTA `part` scans its own contiguous part of
// the row, and whatever a decision needs from the whole row (counts, the
// maximum, the total weight, a digit's bins, prefix sums) is combined over
// the group through the workspace in part order, every CTA reading all
// the partials and so reaching the same decision. Values are compared
// through an order-preserving uint32 key of the float logit (s = logit /
// T is strictly increasing in the logit, so ordering by key is ordering by
// s). Both thresholds are found digit by digit, 8 bits a pass from the
// top: the k-th largest key (top-k) from integer histograms, the last key
// kept by top-p from the bins' weight masses (BinMasses: summed per warp
// in a fixed order, then over the warps in warp order, then over the
// group's CTAs in part order, so the result is deterministic). The final
// inverse-CDF walk uses contiguous per-thread chunks so that id order is
// preserved: chunk sums, an exclusive scan over the CTA and then over the
// group, and each thread walking its own chunk from its prefix.
//
// The group has up to 32 CTAs, rows x group at most 256, no part shorter
// than 4096 ids, and never more CTAs than the device holds at once: the
// CTAs of a group wait for each other at every combine (an arrival
// counter per row; a CTA that waits more than 4 s goes on, marks the row
// poisoned, and the row gives -1 instead of hanging). The passes read the
// logits and weights with 16 elements per thread in flight (Strided /
// Contiguous; 16-byte loads in the contiguous ones).
//
// On the H200 (128,256-entry rows, tests/bench/results/cuda_ops_h200.json
// `sample` rows), one row: the first form, one block per row recomputing
// the weights in every pass and searching top-p's key bit by bit (32
// passes), took 0.48 ms with temperature alone, 2.15 ms with top-k 50 +
// top-p 0.9 and 3.54 ms with top-p 0.9 + min-p 0.05; with the weights
// computed once and one block per row selecting, 0.14, 0.48 and 0.94 ms
// (64 rows: 0.28, 0.70, 1.17 ms); with a group of CTAs per row, 0.042,
// 0.125 and 0.117 ms (64 rows, 4 CTAs each: 0.18, 0.40, 0.54 ms).
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
// The weights kernels: CTAs of kWeightThreads over chunks of kWeightChunk
// logits, so that a row's exponentials spread over the GPU.
constexpr int kWeightThreads = 256;
constexpr int64_t kWeightChunk = 1024;
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

// The row passes of SampleKernel: f(i, logit, weight) for i = tid, tid +
// blockDim.x, ... (Strided) or for i = begin .. end - 1 (Contiguous), in that
// order, with the loads of kAhead elements issued before any is used, so a
// thread has that many in flight instead of one L2 round trip per element
// (weights only when kW). The order of f's calls is the plain loop's, so
// sums come out bitwise the same.
constexpr int kAhead = 16;

template <bool kW, class F>
__device__ __forceinline__ void Strided(const float* x, const float* w, int64_t n, F&& f) {
  const int64_t step = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += kAhead * step) {
    float xv[kAhead], wv[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t i = i0 + j * step;
      xv[j] = i < n ? __ldg(x + i) : 0.0f;
      wv[j] = kW && i < n ? __ldg(w + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (i0 + j * step < n) f(i0 + j * step, xv[j], wv[j]);
    }
  }
}

// Contiguous: a warp's lanes read addresses a chunk apart, so every load
// instruction touches 32 lines; with `vec` (16-byte aligned x + begin and
// w + begin) whole batches go as 16-byte loads, a quarter of the
// instructions.
template <bool kW, class F>
__device__ __forceinline__ void Contiguous(const float* x, const float* w, int64_t begin,
                                           int64_t end, bool vec, F&& f) {
  for (int64_t i0 = begin; i0 < end; i0 += kAhead) {
    float xv[kAhead], wv[kAhead];
    if (vec && i0 + kAhead <= end) {
#pragma unroll
      for (int j = 0; j < kAhead; j += 4) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(x + i0 + j));
        xv[j] = a.x, xv[j + 1] = a.y, xv[j + 2] = a.z, xv[j + 3] = a.w;
        if (kW) {
          const float4 b = __ldg(reinterpret_cast<const float4*>(w + i0 + j));
          wv[j] = b.x, wv[j + 1] = b.y, wv[j + 2] = b.z, wv[j + 3] = b.w;
        } else {
          wv[j] = wv[j + 1] = wv[j + 2] = wv[j + 3] = 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        xv[j] = i0 + j < end ? __ldg(x + i0 + j) : 0.0f;
        wv[j] = kW && i0 + j < end ? __ldg(w + i0 + j) : 0.0f;
      }
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
      ws[j] = i < n ? __ldg(w + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const bool in = keys[j] >= kth_key && (keys[j] & mask) == prefix;
      const uint32_t in_lanes = __ballot_sync(0xffffffffu, in);
      if (in_lanes == 0) continue;  // warp-uniform
      const uint32_t bin = in ? (keys[j] >> shift) & 255u : 256u;
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      const double v = in ? static_cast<double>(ws[j]) : 0.0;
      double sum = 0.0;
      for (uint32_t rest = in_lanes; rest != 0; rest &= rest - 1) {  // ascending lanes
        const int src = __ffs(rest) - 1;
        const double other = __shfl_sync(0xffffffffu, v, src);
        if ((peers >> src) & 1u) sum += other;
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

// Workspace: the rows' largest finite keys, the rows' group arrival
// counters, the groups' slots, then the rows' weights.
struct Workspace {
  uint32_t* max_key;     // [rows] (0 = no finite logit yet)
  uint32_t* arrive;      // [rows][2]: arrivals, poisoned (a CTA gave up waiting)
  unsigned char* slots;  // [rows][2][GroupSlots(rows, vocab)][kSlotBytes]
  float* weights;        // [rows, vocab]
};

size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }
size_t MaxKeyBytes(int64_t rows) { return Round256(static_cast<size_t>(rows) * 4); }
size_t ArriveBytes(int64_t rows) { return Round256(static_cast<size_t>(rows) * 8); }
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

__global__ void ClearRowState(uint32_t* max_key, uint32_t* arrive, int64_t rows) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) {
    max_key[r] = 0;
    arrive[2 * r] = 0;
    arrive[2 * r + 1] = 0;
  }
}

// Grid (chunks, rows): each CTA the largest finite key of its chunk of the
// row (max is order-free, so the result does not depend on the split).
__global__ void __launch_bounds__(kWeightThreads)
    RowMaxKeys(const float* __restrict__ logits, int64_t vocab, int64_t chunk,
               const RowSamplingParams* __restrict__ params, uint32_t* __restrict__ max_key) {
  __shared__ uint32_t scratch[kWeightThreads / 32];
  const int64_t row = blockIdx.y;
  if (!NeedsWeights(params[row])) return;
  const float* x = logits + row * vocab;
  const int64_t begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  uint32_t best = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    if (isfinite(v)) best = max(best, Key(v));
  }
  best = BlockMax(best, scratch, 0u);
  if (threadIdx.x == 0 && best != 0) atomicMax(max_key + row, best);
}

// Grid (chunks, rows): weights[i] = Weight(logit i) for the finite logits
// (0 otherwise), with the row's max from RowMaxKeys.
__global__ void __launch_bounds__(kWeightThreads)
    RowWeights(const float* __restrict__ logits, int64_t vocab, int64_t chunk,
               const RowSamplingParams* __restrict__ params, const uint32_t* __restrict__ max_key,
               float* __restrict__ weights) {
  const int64_t row = blockIdx.y;
  const RowSamplingParams p = params[row];
  if (!NeedsWeights(p) || max_key[row] == 0) return;
  RowState st;
  st.inv_t_denominator = static_cast<double>(p.temperature);
  st.max_s = static_cast<double>(FromKey(max_key[row])) / st.inv_t_denominator;
  const float* x = logits + row * vocab;
  float* w = weights + row * vocab;
  const int64_t begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    w[i] = isfinite(v) ? Weight(v, st) : 0.0f;
  }
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
    T acc = Read<T>(0, 0);
    for (int p = 1; p < parts; ++p) fold(acc, Read<T>(p, 0), p);
    ++level;
    return acc;
  }
  // The group's sum of one value per CTA, in part order; *prefix (optional)
  // gets the sum over the parts before this one.
  template <class T>
  __device__ T Sum(T v, T* prefix = nullptr) {
    T before = T(0);
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
      T total = Read<T>(0, threadIdx.x);
      for (int p = 1; p < parts; ++p) total += Read<T>(p, threadIdx.x);
      bins[threadIdx.x] = total;
    }
    ++level;
    __syncthreads();
  }
};

// Pass 1's findings, combined over the group.
struct FirstPass {
  int bad, finite;
  float maxv;
  ValueIndex best;
};

__global__ void __launch_bounds__(kThreads, 2)
    SampleKernel(const float* __restrict__ logits, int64_t vocab,
                 const RowSamplingParams* __restrict__ params, const float* __restrict__ weights,
                 int32_t* __restrict__ out, uint32_t* __restrict__ arrive,
                 unsigned char* __restrict__ slots, int slot_stride) {
  __shared__ int iscratch[33];
  __shared__ double dscratch[33];
  __shared__ float fscratch[32];
  __shared__ ValueIndex vscratch[32];
  __shared__ int64_t chosen;
  __shared__ int n_keep_ties;
  __shared__ int hist[256];
  __shared__ double warp_bins[kThreads / 32][256];  // top-p: per-warp bin masses
  __shared__ uint32_t radix_prefix;
  __shared__ int radix_remaining;

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
  auto finish = [&](int64_t token) {
    if (grp.part == 0 && tid == 0) {
      const bool poisoned = grp.timed_out || AcquireLoad(grp.arrive + 1) != 0;
      out[row] = poisoned ? -1 : static_cast<int32_t>(token);
    }
  };

  // Pass 1: validation, max, argmax.
  int bad = 0, finite = 0;
  float maxv = -__int_as_float(0x7f800000);
  ValueIndex best{-__int_as_float(0x7f800000), INT64_MAX};
  Strided<false>(x, w, n, [&](int64_t i, float v, float) {
    if (isnan(v) || v == __int_as_float(0x7f800000)) bad = 1;
    if (isfinite(v)) {
      ++finite;
      maxv = fmaxf(maxv, v);
    }
    const ValueIndex c{v, grp.begin + i};
    if (Better(c, best)) best = c;
  });
  FirstPass first;
  first.bad = __syncthreads_or(bad);
  first.finite = BlockSum(finite, iscratch);
  first.maxv = BlockMax(maxv, fscratch, -__int_as_float(0x7f800000));
  first.best = BlockArgmax(best, vscratch);
  first = grp.Combine(first, [](FirstPass& all, const FirstPass& f, int) {
    all.bad |= f.bad;
    all.finite += f.finite;
    all.maxv = fmaxf(all.maxv, f.maxv);
    if (Better(f.best, all.best)) all.best = f.best;
  });
  const bool params_bad = !ParamsValid(p);
  const int n_finite = first.finite;
  if (first.bad || n_finite == 0 || params_bad) {
    finish(-1);
    return;
  }
  if (p.temperature < kGreedyTemperature) {
    finish(first.best.index);
    return;
  }
  maxv = first.maxv;
  RowState st;
  st.inv_t_denominator = static_cast<double>(p.temperature);
  st.max_s = static_cast<double>(maxv) / st.inv_t_denominator;

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
      Strided<false>(x, w, n, [&](int64_t, float v, float) {
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
      if (tid == 0) {
        // The k-th largest lies in the highest bin b where the counts of the
        // bins above it stay below `remaining`.
        int above = 0;
        int b = 255;
        for (; b > 0; --b) {
          if (above + hist[b] >= remaining) break;
          above += hist[b];
        }
        radix_prefix = prefix | (static_cast<uint32_t>(b) << shift);
        radix_remaining = remaining - above;
      }
      __syncthreads();
      prefix = radix_prefix;
      remaining = radix_remaining;
      mask |= 255u << shift;
    }
    kth_key = prefix;
  }
  // Candidates: finite and key >= kth_key (kth_key > kNegInfKey).

  // Total weight of the candidates.
  double total = 0;
  Strided<true>(x, w, n, [&](int64_t, float v, float wi) {
    if (Key(v) >= kth_key) total += wi;
  });
  total = grp.Sum(BlockSum(total, dscratch));

  // Step 5: top-p. f(c) = weight of candidates with key > c, non-increasing;
  // last_key = the smallest key with f < target: everything above it stays,
  // and of its ties (same value, same weight) the first n_keep_ties by id.
  const bool top_p = p.top_p < 1.0f;
  uint32_t last_key = 0;
  if (top_p) {
    const double target = static_cast<double>(p.top_p) * total;
    // Radix search, 8 bits a level: with the keys' top bits fixed to
    // `prefix` and `above` = the mass of candidates above that bracket,
    // bin b of the next digit holds the bracket's keys with digit b;
    // g(b) = above + the mass of bins > b is f at the top of bin b, and
    // last_key lies in the lowest bin with g(b) < target (g(255) = above,
    // f(2^32 - 1) = 0 < target).
    uint32_t prefix = 0, mask = 0;
    double above_bracket = 0;
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
      if (tid == 0) {
        // Scan from the top bin down: g holds g(b) (< target), the bin
        // below is entered while g(b - 1) = g(b) + mass(b) stays below
        // target.
        double g = above_bracket;
        int lowest = 0;
        for (int b = 255; b > 0; --b) {
          const double next = g + warp_bins[0][b];
          if (next >= target) {
            lowest = b;
            break;
          }
          g = next;
        }
        const double above = g;  // g(lowest): the mass above the new bracket
        radix_prefix = prefix | (static_cast<uint32_t>(lowest) << shift);
        dscratch[32] = above;
      }
      __syncthreads();
      prefix = radix_prefix;
      above_bracket = dscratch[32];
      mask |= 255u << shift;
      __syncthreads();
    }
    last_key = prefix;
    double above = 0;
    int ties = 0;
    Strided<true>(x, w, n, [&](int64_t, float v, float wi) {
      const uint32_t key = Key(v);
      if (key >= kth_key && key > last_key) above += wi;
      if (key == last_key) ++ties;
    });
    struct AboveTies {
      double above;
      int64_t ties;
    };
    const AboveTies at = grp.Combine(AboveTies{BlockSum(above, dscratch), BlockSum(ties, iscratch)},
                                     [](AboveTies& acc, const AboveTies& next, int) {
                                       acc.above += next.above;
                                       acc.ties += next.ties;
                                     });
    above = at.above;
    ties = static_cast<int>(at.ties);
    if (tid == 0) {
      const float w_last = Weight(FromKey(last_key), st);
      double before = above;
      int keep = 0;
      while (keep < ties && before < target) {
        before += w_last;
        ++keep;
      }
      n_keep_ties = keep;
    }
    __syncthreads();
  }
  const int keep_ties = top_p ? n_keep_ties : 0;

  // Contiguous chunks of the CTA's part from here on (id order matters for
  // ties and the CDF), a multiple of 4 ids each (16-byte loads).
  const int64_t chunk = ((n + nthreads - 1) / nthreads + 3) / 4 * 4;
  const int64_t begin = min(n, tid * chunk);
  const int64_t end = min(n, begin + chunk);
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;

  int tie_base = 0;
  if (top_p) {
    int my_ties = 0;
    Contiguous<false>(x, w, begin, end, vec,
                      [&](int64_t, float v, float) { my_ties += Key(v) == last_key ? 1 : 0; });
    int block_ties = 0;
    tie_base = BlockExclusiveScan(my_ties, iscratch, &block_ties);
    int before = 0;
    grp.Sum(block_ties, &before);
    tie_base += before;
  }
  const float min_p = p.min_p;
  // Survivor weight (0 when the token does not survive steps 4-6).
  auto survivor_weight = [&](float v, float wi, int* tie_rank) -> float {
    const uint32_t key = Key(v);
    if (key < kth_key) return 0.0f;  // also drops -inf
    if (top_p) {
      if (key < last_key) return 0.0f;
      if (key == last_key) {
        const int rank = (*tie_rank)++;
        if (rank >= keep_ties) return 0.0f;
      }
    }
    if (min_p > 0.0f && wi < min_p) return 0.0f;
    return wi;
  };

  double my_total = 0;
  int64_t my_last = -1;
  {
    int rank = tie_base;
    Contiguous<true>(x, w, begin, end, vec, [&](int64_t i, float v, float wv) {
      const float wi = survivor_weight(v, wv, &rank);
      if (wi > 0.0f) {
        my_total += wi;
        my_last = grp.begin + i;
      }
    });
  }
  const double total2 = grp.Sum(BlockSum(my_total, dscratch));
  // The maximum always survives (weight 1), so total2 >= 1.
  if (tid == 0) chosen = INT64_MAX;
  __syncthreads();
  const double u = UniformFromSeed(p.seed, static_cast<uint64_t>(p.position), /*kSample=*/0);
  double my_mass = 0;
  {
    int rank = tie_base;
    Contiguous<true>(x, w, begin, end, vec, [&](int64_t, float v, float wv) {
      const float wi = survivor_weight(v, wv, &rank);
      if (wi > 0.0f) my_mass += static_cast<double>(wi) / total2;
    });
  }
  double block_mass = 0;
  double prefix = BlockExclusiveScan(my_mass, dscratch, &block_mass);
  double parts_before = 0;
  grp.Sum(block_mass, &parts_before);
  prefix += parts_before;
  if (u < prefix + my_mass + 1e-12) {  // slack: the walk below decides exactly
    int rank = tie_base;
    double cumulative = prefix;
    for (int64_t i = begin; i < end; ++i) {  // (one or two threads: a plain walk)
      const float wi = survivor_weight(x[i], w[i], &rank);
      if (wi > 0.0f) {
        cumulative += static_cast<double>(wi) / total2;
        if (u < cumulative) {
          atomicMin(reinterpret_cast<unsigned long long*>(&chosen),
                    static_cast<unsigned long long>(grp.begin + i));
          break;
        }
      }
    }
  }
  // Fallback (u beyond the rounded total): the last survivor, as the CPU.
  const ValueIndex last = BlockArgmax(
      ValueIndex{my_last >= 0 ? static_cast<float>(my_last) : -1.0f, my_last}, vscratch);
  __syncthreads();
  // Over the group: the lowest chosen id, and the last survivor (ids are
  // below 2^24, so both fit a float's integer range).
  struct Picks {
    int64_t chosen, last;
  };
  const Picks picks =
      grp.Combine(Picks{chosen, last.index}, [](Picks& all, const Picks& next, int) {
        all.chosen = min(all.chosen, next.chosen);
        all.last = max(all.last, next.last);
      });
  finish(picks.chosen != INT64_MAX ? picks.chosen : picks.last);
}

}  // namespace

size_t SampleRowsWorkspaceBytes(int64_t rows, int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return MaxKeyBytes(rows) + ArriveBytes(rows) + SlotBytes(rows, vocab) +
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
  ws.max_key = reinterpret_cast<uint32_t*>(base);
  ws.arrive = reinterpret_cast<uint32_t*>(base + MaxKeyBytes(rows));
  ws.slots = reinterpret_cast<unsigned char*>(base + MaxKeyBytes(rows) + ArriveBytes(rows));
  ws.weights = reinterpret_cast<float*>(base + MaxKeyBytes(rows) + ArriveBytes(rows) +
                                        SlotBytes(rows, vocab));
  // The group: as many CTAs per row as the slots allow and the device
  // holds at once for all rows (they wait for each other).
  const int slots_per_row = GroupSlots(rows, vocab);
  const int group = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(slots_per_row, ResidentSampleCtas() / rows)));
  const cudaStream_t s = AsCuda(stream);
  const dim3 grid(static_cast<unsigned>((vocab + kWeightChunk - 1) / kWeightChunk),
                  static_cast<unsigned>(rows));
  ClearRowState<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, s>>>(ws.max_key, ws.arrive,
                                                                          rows);
  RowMaxKeys<<<grid, kWeightThreads, 0, s>>>(logits, vocab, kWeightChunk, params, ws.max_key);
  RowWeights<<<grid, kWeightThreads, 0, s>>>(logits, vocab, kWeightChunk, params, ws.max_key,
                                             ws.weights);
  SampleKernel<<<dim3(static_cast<unsigned>(group), static_cast<unsigned>(rows)), kThreads, 0, s>>>(
      logits, vocab, params, ws.weights, out, ws.arrive, ws.slots, slots_per_row);
  return CheckLastLaunch("SampleRows");
}

}  // namespace tessera::kernels::cuda
