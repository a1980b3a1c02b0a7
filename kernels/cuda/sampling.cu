// GPU sampling, the algorithm of worker/sampling/sampler.cc (see sampling.h).
//
// One block per row. Values are compared through an order-preserving uint32
// key of the float logit (s = logit / T is strictly increasing in the logit,
// so ordering by key is ordering by s). The k-th largest key (top-k) is
// found by an 8-bit radix select (4 passes), the last key kept by top-p by a
// bitwise search from the top bit (one pass and a fixed-order block
// reduction per bit, summing weights only above the probe); the
// weights exp(s - max) are recomputed from the logits when needed (no
// scratch memory). The final inverse-CDF walk uses contiguous per-thread
// chunks so that id order is preserved: chunk sums, an exclusive scan, and
// each thread walking its own chunk from its prefix.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/sampling.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr float kGreedyTemperature = 1e-5f;   // worker/sampling/sampling_params.h
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

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int64_t vocab,
                 const RowSamplingParams* __restrict__ params, int32_t* __restrict__ out) {
  __shared__ int iscratch[33];
  __shared__ double dscratch[33];
  __shared__ float fscratch[32];
  __shared__ ValueIndex vscratch[32];
  __shared__ int64_t chosen;
  __shared__ int n_keep_ties;
  __shared__ int hist[256];
  __shared__ uint32_t radix_prefix;
  __shared__ int radix_remaining;

  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const RowSamplingParams p = params[row];
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;

  // Pass 1: validation, max, argmax.
  int bad = 0, finite = 0;
  float maxv = -__int_as_float(0x7f800000);
  ValueIndex best{-__int_as_float(0x7f800000), INT64_MAX};
  for (int64_t i = tid; i < vocab; i += nthreads) {
    const float v = x[i];
    if (isnan(v) || v == __int_as_float(0x7f800000)) bad = 1;
    if (isfinite(v)) {
      ++finite;
      maxv = fmaxf(maxv, v);
    }
    const ValueIndex c{v, i};
    if (Better(c, best)) best = c;
  }
  const bool params_bad = !(p.temperature >= 0.0f) || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
                          !(p.min_p >= 0.0f && p.min_p <= 1.0f) || p.position < 0;
  bad = __syncthreads_or(bad);
  const int n_finite = BlockSum(finite, iscratch);
  if (bad || n_finite == 0 || params_bad) {
    if (tid == 0) out[row] = -1;
    return;
  }
  if (p.temperature < kGreedyTemperature) {
    best = BlockArgmax(best, vscratch);
    if (tid == 0) out[row] = static_cast<int32_t>(best.index);
    return;
  }
  maxv = BlockMax(maxv, fscratch, -__int_as_float(0x7f800000));
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
      for (int64_t i = tid; i < vocab; i += nthreads) {
        const uint32_t key = Key(x[i]);
        if (key > kNegInfKey && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
      }
      __syncthreads();
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
  for (int64_t i = tid; i < vocab; i += nthreads) {
    const float v = x[i];
    if (Key(v) >= kth_key) total += Weight(v, st);
  }
  total = BlockSum(total, dscratch);

  // Step 5: top-p. f(c) = weight of candidates with key > c, non-increasing;
  // last_key = the smallest key with f < target: everything above it stays,
  // and of its ties (same value, same weight) the first n_keep_ties by id.
  const bool top_p = p.top_p < 1.0f;
  uint32_t last_key = 0;
  if (top_p) {
    const double target = static_cast<double>(p.top_p) * total;
    uint32_t ans = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = ans | (1u << bit);
      double mass = 0;
      for (int64_t i = tid; i < vocab; i += nthreads) {
        const float v = x[i];
        const uint32_t key = Key(v);
        if (key >= kth_key && key > c) mass += Weight(v, st);
      }
      mass = BlockSum(mass, dscratch);
      if (mass >= target) ans = c;
    }
    last_key = ans + 1;  // f(0) = total >= target, so ans < 2^32 - 1
    double above = 0;
    int ties = 0;
    for (int64_t i = tid; i < vocab; i += nthreads) {
      const float v = x[i];
      const uint32_t key = Key(v);
      if (key >= kth_key && key > last_key) above += Weight(v, st);
      if (key == last_key) ++ties;
    }
    above = BlockSum(above, dscratch);
    ties = BlockSum(ties, iscratch);
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

  // Contiguous chunks from here on (id order matters for ties and the CDF).
  const int64_t chunk = (vocab + nthreads - 1) / nthreads;
  const int64_t begin = min(vocab, tid * chunk);
  const int64_t end = min(vocab, begin + chunk);

  int tie_base = 0;
  if (top_p) {
    int my_ties = 0;
    for (int64_t i = begin; i < end; ++i) my_ties += Key(x[i]) == last_key ? 1 : 0;
    tie_base = BlockExclusiveScan(my_ties, iscratch, static_cast<int*>(nullptr));
  }
  const float min_p = p.min_p;
  // Survivor weight (0 when the token does not survive steps 4-6).
  auto survivor_weight = [&](int64_t i, int* tie_rank) -> float {
    const float v = x[i];
    const uint32_t key = Key(v);
    if (key < kth_key) return 0.0f;  // also drops -inf
    if (top_p) {
      if (key < last_key) return 0.0f;
      if (key == last_key) {
        const int rank = (*tie_rank)++;
        if (rank >= keep_ties) return 0.0f;
      }
    }
    const float w = Weight(v, st);
    if (min_p > 0.0f && w < min_p) return 0.0f;
    return w;
  };

  double my_total = 0;
  int64_t my_last = -1;
  {
    int rank = tie_base;
    for (int64_t i = begin; i < end; ++i) {
      const float w = survivor_weight(i, &rank);
      if (w > 0.0f) {
        my_total += w;
        my_last = i;
      }
    }
  }
  const double total2 = BlockSum(my_total, dscratch);
  // The maximum always survives (weight 1), so total2 >= 1.
  if (tid == 0) chosen = INT64_MAX;
  __syncthreads();
  const double u = UniformFromSeed(p.seed, static_cast<uint64_t>(p.position), /*kSample=*/0);
  double my_mass = 0;
  {
    int rank = tie_base;
    for (int64_t i = begin; i < end; ++i) {
      const float w = survivor_weight(i, &rank);
      if (w > 0.0f) my_mass += static_cast<double>(w) / total2;
    }
  }
  const double prefix = BlockExclusiveScan(my_mass, dscratch, static_cast<double*>(nullptr));
  if (u < prefix + my_mass + 1e-12) {  // slack: the walk below decides exactly
    int rank = tie_base;
    double cumulative = prefix;
    for (int64_t i = begin; i < end; ++i) {
      const float w = survivor_weight(i, &rank);
      if (w > 0.0f) {
        cumulative += static_cast<double>(w) / total2;
        if (u < cumulative) {
          atomicMin(reinterpret_cast<unsigned long long*>(&chosen),
                    static_cast<unsigned long long>(i));
          break;
        }
      }
    }
  }
  // Fallback (u beyond the rounded total): the last survivor, as the CPU.
  const ValueIndex last = BlockArgmax(
      ValueIndex{my_last >= 0 ? static_cast<float>(my_last) : -1.0f, my_last}, vscratch);
  __syncthreads();
  if (tid == 0) {
    int64_t token = chosen;
    if (token == INT64_MAX) token = last.index;
    out[row] = static_cast<int32_t>(token);
  }
}

}  // namespace

absl::Status SampleRows(const float* logits, int64_t rows, int64_t vocab,
                        const RowSamplingParams* params, int32_t* out, CudaStream stream) {
  if (rows < 0 || vocab <= 0 || rows > 2147483647 || vocab > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: bad shape rows=", rows,
                                                   " vocab=", vocab, " (vocab at most 2^24)"));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("SampleRows: null pointer");
  }
  SampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, AsCuda(stream)>>>(logits, vocab, params,
                                                                             out);
  return CheckLastLaunch("SampleRows");
}

}  // namespace tessera::kernels::cuda
