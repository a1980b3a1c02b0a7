#include "kernels/cuda/p2p_all_reduce.h"

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxRanks = 8;
// Up to 128 CTAs of 512 threads (all resident at once on the GPUs this
// runs on), 8 KiB of message (one 16-byte unit per thread) or one row of
// the fused form each: on 2 x H200, 512 KB took 6.3 us with 16 KiB per CTA
// (at most 32) and 5.9 with 8 KiB; fused with add + RMSNorm 9.2 with two
// rows per CTA and 7.6 with one.
constexpr int kMaxCtas = 128;
constexpr int kThreads = 512;
constexpr int64_t kBytesPerCta = 8 << 10;
constexpr int kBuffers = 3;
constexpr uint32_t kEmptyPair = 0x80008000u;    // two bf16 -0.0: an empty inbox slot
constexpr uint64_t kTimeoutNs = 2000000000ull;  // a peer that has not pushed in 2 s is gone

// The per-rank state words (device memory).
enum : int { kBuffer = 0, kPrevCount = 1, kCtasDone = 2, kTimeouts = 3, kStateWords = 4 };

struct PeerTable {
  // inbox[r]: rank r's receive buffers, [kBuffers][world senders][cap].
  uint16_t* inbox[kMaxRanks];
};

struct Exchange {
  const PeerTable* table;
  uint32_t* state;
  uint32_t* timed_out;  // host-mapped word: set by a call that gave up (TakeTimedOut)
  int64_t cap;
  int rank, world;
};

// What one call of one CTA works with.
struct Call {
  PeerTable t;
  int64_t send;  // element offset of this rank's slot in a peer's inbox, this call's buffer
  int64_t recv;  // element offset of this call's buffer in the own inbox
  uint32_t buffer;
  uint32_t prev_count;
};

__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint4 LoadVolatile(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint16_t LoadVolatile(const uint16_t* p) {
  uint16_t v;
  asm volatile("ld.volatile.global.u16 %0, [%1];\n" : "=h"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreVolatile(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void StoreVolatile(uint16_t* p, uint16_t v) {
  asm volatile("st.volatile.global.u16 [%0], %1;\n" ::"l"(p), "h"(v) : "memory");
}

// -0.0 (the empty marker) becomes +0.0; every other value is kept.
__device__ __forceinline__ uint16_t NoNegZero(uint16_t h) { return h == 0x8000u ? 0 : h; }
__device__ __forceinline__ uint32_t NoNegZero(uint32_t w) {
  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
  if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
  return w;
}
__device__ __forceinline__ uint4 NoNegZero(uint4 v) {
  return make_uint4(NoNegZero(v.x), NoNegZero(v.y), NoNegZero(v.z), NoNegZero(v.w));
}
__device__ __forceinline__ bool Filled(uint32_t w) {
  return (w & 0xffffu) != 0x8000u && (w >> 16) != 0x8000u;
}
__device__ __forceinline__ bool Filled(uint4 v) {
  return Filled(v.x) && Filled(v.y) && Filled(v.z) && Filled(v.w);
}
__device__ __forceinline__ bool Filled(uint16_t h) { return h != 0x8000u; }

// Whether a wait that began at `start` (0: not yet stamped; set on the
// first check) has passed kTimeoutNs; the clock is read every 256 spins.
__device__ __forceinline__ bool WaitedTooLong(uint32_t spins, uint64_t& start) {
  if ((spins & 255) != 0) return false;
  const uint64_t now = GlobalTimerNs();
  if (start == 0) start = now;
  return now - start > kTimeoutNs;
}

// Waits until the slot at `p` holds a pushed value and returns it; after
// kTimeoutNs (or once this thread timed out before) returns zeros instead.
template <class T>
__device__ __forceinline__ T Receive(const T* p, bool& timed_out) {
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    const T v = LoadVolatile(p);
    if (Filled(v)) return v;
    if (timed_out) return T{};
    if (WaitedTooLong(spins, start)) {
      timed_out = true;
      return T{};
    }
  }
}

// Receives units p[0], p[stride], ... p[(kBatch - 1) * stride] (those with
// valid[j]) into v: every missing unit is re-read in each pass, so the
// loads of a pass are in flight together instead of one round trip each.
// On timeout (or after an earlier one) the missing units read as zeros.
template <int kBatch>
__device__ __forceinline__ void ReceiveBatch(const uint4* p, int64_t stride,
                                             const bool (&valid)[kBatch], uint4 (&v)[kBatch],
                                             bool& timed_out) {
  bool done[kBatch];
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    done[j] = !valid[j];
    v[j] = make_uint4(0, 0, 0, 0);
  }
  uint64_t start = 0;
  for (uint32_t spins = 0;; ++spins) {
    uint4 got[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!done[j]) got[j] = LoadVolatile(p + j * stride);
    }
    bool all = true;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (done[j]) continue;
      if (Filled(got[j])) {
        v[j] = got[j];
        done[j] = true;
      } else {
        all = false;
      }
    }
    if (all || timed_out) return;
    if (WaitedTooLong(spins, start)) {
      timed_out = true;
      return;
    }
  }
}

// Adds 8 bf16 values (a 16-byte vector) to 8 fp32 sums.
__device__ __forceinline__ void Accumulate(float (&acc)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[2 * j] += __uint_as_float(w[j] << 16);
    acc[2 * j + 1] += __uint_as_float(w[j] & 0xffff0000u);
  }
}

// Thread 0 reads the call's buffer and the previous call's size; every
// thread gets them through shared memory.
__device__ __forceinline__ Call BeginCall(const Exchange& x) {
  __shared__ uint32_t s_buffer, s_prev;
  if (threadIdx.x == 0) {
    s_buffer = LoadVolatile(x.state + kBuffer);
    s_prev = LoadVolatile(x.state + kPrevCount);
  }
  __syncthreads();
  Call c;
  c.t = *x.table;
  c.buffer = s_buffer;
  c.prev_count = s_prev;
  c.send = (int64_t{c.buffer} * x.world + x.rank) * x.cap;
  c.recv = int64_t{c.buffer} * x.world * x.cap;
  return c;
}

// Marks the previous call's slots of the own inbox empty again (buffer
// (b + 2) % 3 = the previous call's), spread over the whole grid.
__device__ __forceinline__ void Reclear(const Exchange& x, const Call& c) {
  const int64_t vecs = (int64_t{c.prev_count} + 7) / 8;  // cap is a multiple of 8
  const uint32_t old = (c.buffer + kBuffers - 1) % kBuffers;
  uint16_t* base = c.t.inbox[x.rank] + int64_t{old} * x.world * x.cap;
  const uint4 empty = make_uint4(kEmptyPair, kEmptyPair, kEmptyPair, kEmptyPair);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < x.world * vecs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int p = static_cast<int>(i / vecs);
    if (p == x.rank) continue;
    reinterpret_cast<uint4*>(base + p * x.cap)[i % vecs] = empty;
  }
}

// The last CTA of the call to get here advances the call state.
__device__ __forceinline__ void EndCall(const Exchange& x, const Call& c, uint32_t count,
                                        bool timed_out) {
  __shared__ int s_timed_out;
  if (threadIdx.x == 0) s_timed_out = 0;
  __syncthreads();
  if (timed_out) s_timed_out = 1;
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (s_timed_out) {
    atomicAdd(x.state + kTimeouts, 1u);
    *reinterpret_cast<volatile uint32_t*>(x.timed_out) = 1u;
  }
  // No fence: the state is read by the next call, which starts after this
  // kernel ends, and a fence here would wait until this thread's stores to
  // the peers are acknowledged (2 x H200: the fused 8 KB call took 6.45 us
  // with the fences and batch-1 row loads, 5.87 without and batched).
  if (atomicAdd(x.state + kCtasDone, 1u) == gridDim.x - 1) {
    x.state[kPrevCount] = count;
    x.state[kCtasDone] = 0;
    x.state[kBuffer] = (c.buffer + 1) % kBuffers;
  }
}

// The sum over ranks (rank order) of 16-byte unit u: `own` is this rank's
// (already without -0.0), the others come from the own inbox.
__device__ __forceinline__ void SumUnit(const Exchange& x, const Call& c, int64_t u, uint4 own,
                                        float (&acc)[8], bool& timed_out) {
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  const uint16_t* box = c.t.inbox[x.rank] + c.recv;
  for (int p = 0; p < x.world; ++p) {
    const uint4 v =
        p == x.rank ? own : Receive(reinterpret_cast<const uint4*>(box + p * x.cap) + u, timed_out);
    Accumulate(acc, v);
  }
}

__device__ __forceinline__ void PushUnit(const Exchange& x, const Call& c, int64_t u, uint4 v) {
  for (int p = 0; p < x.world; ++p) {
    if (p != x.rank) StoreVolatile(reinterpret_cast<uint4*>(c.t.inbox[p] + c.send) + u, v);
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) |
         (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
}

// In-place all-reduce of n values. VEC: 16-byte units (n % 8 == 0, data
// aligned), else single values; CTA b owns a contiguous slice.
template <bool VEC>
__global__ void __launch_bounds__(kThreads) AllReduceKernel(uint16_t* data, int64_t n, Exchange x) {
  const Call c = BeginCall(x);
  const int64_t units = VEC ? n / 8 : n;
  const int64_t per = (units + gridDim.x - 1) / gridDim.x;
  const int64_t u0 = min(units, blockIdx.x * per);
  const int64_t u1 = min(units, u0 + per);
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    if constexpr (VEC) {
      PushUnit(x, c, u, NoNegZero(reinterpret_cast<const uint4*>(data)[u]));
    } else {
      const uint16_t v = NoNegZero(data[u]);
      for (int p = 0; p < x.world; ++p) {
        if (p != x.rank) StoreVolatile(c.t.inbox[p] + c.send + u, v);
      }
    }
  }
  Reclear(x, c);
  bool timed_out = false;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    if constexpr (VEC) {
      float acc[8];
      SumUnit(x, c, u, NoNegZero(reinterpret_cast<const uint4*>(data)[u]), acc, timed_out);
      reinterpret_cast<uint4*>(data)[u] =
          make_uint4(PackBf16(acc[0], acc[1]), PackBf16(acc[2], acc[3]), PackBf16(acc[4], acc[5]),
                     PackBf16(acc[6], acc[7]));
    } else {
      float sum = 0.f;
      const uint16_t* box = c.t.inbox[x.rank] + c.recv;
      for (int p = 0; p < x.world; ++p) {
        const uint16_t v =
            p == x.rank ? NoNegZero(data[u]) : Receive(box + p * x.cap + u, timed_out);
        sum += Bf16BitsToFloat(v);
      }
      data[u] = FloatToBf16Bits(sum);
    }
  }
  EndCall(x, c, static_cast<uint32_t>(n), timed_out);
}

// Units of a row one thread of the fused kernel has in flight at once
// (each unit's own value, residual and peers' values are loaded before any
// is used; 2 keeps the kernel at 126 registers).
constexpr int kRowBatch = 2;

// acc[j] = the sum over the ranks, in rank order, of unit `unit + j *
// stride` (those with valid[j]): `own` for this rank, the peers' values
// from the own inbox `box` (ReceiveBatch).
template <int kBatch>
__device__ __forceinline__ void SumBatch(const Exchange& x, const uint16_t* box, int64_t unit,
                                         int64_t stride, const bool (&valid)[kBatch],
                                         const uint4 (&own)[kBatch], float (&acc)[kBatch][8],
                                         bool& timed_out) {
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;
  }
  for (int p = 0; p < x.world; ++p) {
    uint4 v[kBatch];
    if (p == x.rank) {
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = own[j];
    } else {
      ReceiveBatch<kBatch>(reinterpret_cast<const uint4*>(box + p * x.cap) + unit, stride, valid, v,
                           timed_out);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) Accumulate(acc[j], v[j]);
  }
}

// Adds the all-reduce's 8 sums, rounded to bf16 as the all-reduce would
// store them, to 8 fp32 residual values and their squares to ss
// (FusedAddRmsNorm's arithmetic and order).
__device__ __forceinline__ void AddSum(float4& a, float4& b, const float (&acc)[8], float& ss) {
  a.x += Bf16BitsToFloat(FloatToBf16Bits(acc[0]));
  a.y += Bf16BitsToFloat(FloatToBf16Bits(acc[1]));
  a.z += Bf16BitsToFloat(FloatToBf16Bits(acc[2]));
  a.w += Bf16BitsToFloat(FloatToBf16Bits(acc[3]));
  b.x += Bf16BitsToFloat(FloatToBf16Bits(acc[4]));
  b.y += Bf16BitsToFloat(FloatToBf16Bits(acc[5]));
  b.z += Bf16BitsToFloat(FloatToBf16Bits(acc[6]));
  b.w += Bf16BitsToFloat(FloatToBf16Bits(acc[7]));
  ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
}

// 8 residual values times inv and the norm weights, as bf16.
__device__ __forceinline__ uint4 Normalized(float4 a, float4 b, float inv, float4 ga, float4 gb) {
  return make_uint4(
      PackBf16(a.x * inv * ga.x, a.y * inv * ga.y), PackBf16(a.z * inv * ga.z, a.w * inv * ga.w),
      PackBf16(b.x * inv * gb.x, b.y * inv * gb.y), PackBf16(b.z * inv * gb.z, b.w * inv * gb.w));
}

// The fused form: rows of `cols` values (cols % 8 == 0), CTA b owns rows
// b, b + grid, ...; per row: sum, residual += bf16(sum) (= without
// `accumulate`), RMSNorm into out (FusedAddRmsNorm's arithmetic). A thread
// takes units threadIdx.x + j * blockDim.x of a row.
__global__ void __launch_bounds__(kThreads)
    AllReduceAddRmsNormKernel(const uint16_t* delta, float* residual, int64_t rows, int64_t cols,
                              const float* w, float eps, uint16_t* out, bool accumulate,
                              Exchange x) {
  AllowDependentLaunch();
  constexpr int B = kRowBatch;
  __shared__ float scratch[32];
  const Call c = BeginCall(x);
  const int64_t row_units = cols / 8;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int64_t k = threadIdx.x; k < row_units; k += blockDim.x) {
      const int64_t u = row * row_units + k;
      PushUnit(x, c, u, NoNegZero(reinterpret_cast<const uint4*>(delta)[u]));
    }
  }
  Reclear(x, c);
  bool timed_out = false;
  const int64_t stride = blockDim.x;
  const uint16_t* box = c.t.inbox[x.rank] + c.recv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* own_row = reinterpret_cast<const uint4*>(delta) + row * row_units;
    float4* res = reinterpret_cast<float4*>(residual + row * cols);
    float ss = 0.f;
    for (int64_t k0 = threadIdx.x; k0 < row_units; k0 += B * stride) {
      bool valid[B];
      uint4 own[B];
      float4 a[B], b[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const int64_t k = k0 + j * stride;
        valid[j] = k < row_units;
        own[j] = valid[j] ? NoNegZero(own_row[k]) : make_uint4(0, 0, 0, 0);
        const bool load = valid[j] && accumulate;
        a[j] = load ? res[2 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
        b[j] = load ? res[2 * k + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float acc[B][8];
      SumBatch<B>(x, box, row * row_units + k0, stride, valid, own, acc, timed_out);
#pragma unroll
      for (int j = 0; j < B; ++j) {
        if (!valid[j]) continue;
        const int64_t k = k0 + j * stride;
        float4 ra = a[j], rb = b[j];
        AddSum(ra, rb, acc[j], ss);
        res[2 * k] = ra;
        res[2 * k + 1] = rb;
      }
    }
    ss = BlockSum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
    // Each thread re-reads exactly the residual values it wrote above.
    const float4* g = reinterpret_cast<const float4*>(w);
    uint4* o = reinterpret_cast<uint4*>(out + row * cols);
    for (int64_t k0 = threadIdx.x; k0 < row_units; k0 += B * stride) {
      float4 a[B], b[B], ga[B], gb[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const int64_t k = k0 + j * stride;
        if (k >= row_units) continue;
        a[j] = res[2 * k];
        b[j] = res[2 * k + 1];
        ga[j] = g[2 * k];
        gb[j] = g[2 * k + 1];
      }
#pragma unroll
      for (int j = 0; j < B; ++j) {
        const int64_t k = k0 + j * stride;
        if (k >= row_units) continue;
        o[k] = Normalized(a[j], b[j], inv, ga[j], gb[j]);
      }
    }
  }
  EndCall(x, c, static_cast<uint32_t>(rows * cols), timed_out);
}

// The fused form when every CTA owns one row that its threads cover in one
// pass (rows <= grid, cols <= 8 * kRowBatch * kThreads). It is launched as
// a programmatic dependent of the projection before it (LaunchDependent):
// the loads of the residual (with `accumulate`) and norm weights, which
// that kernel must not write, the call state, and re-marking the previous
// call's inbox slots come before WaitForPrimary, overlapping the
// projection's end (dependent_launch.cuh says what else must hold); only
// the row's own values, the projection's output, are loaded after it. The
// summed residual stays in registers for the normalization instead of
// being read back.
__global__ void __launch_bounds__(kThreads)
    AllReduceAddRmsNormRowKernel(const uint16_t* delta, float* residual, int64_t cols,
                                 const float* w, float eps, uint16_t* out, bool accumulate,
                                 Exchange x) {
  constexpr int B = kRowBatch;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t row_units = cols / 8;
  const uint4* own_row = reinterpret_cast<const uint4*>(delta) + row * row_units;
  float4* res = reinterpret_cast<float4*>(residual + row * cols);
  const float4* g = reinterpret_cast<const float4*>(w);
  bool valid[B];
  uint4 own[B];
  float4 a[B], b[B], ga[B], gb[B];
#pragma unroll
  for (int j = 0; j < B; ++j) {
    const int64_t k = threadIdx.x + j * kThreads;
    valid[j] = k < row_units;
    const bool load = valid[j] && accumulate;
    a[j] = load ? res[2 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
    b[j] = load ? res[2 * k + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
    ga[j] = valid[j] ? g[2 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
    gb[j] = valid[j] ? g[2 * k + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const Call c = BeginCall(x);
  Reclear(x, c);
  WaitForPrimary();
#pragma unroll
  for (int j = 0; j < B; ++j) {
    own[j] = valid[j] ? NoNegZero(own_row[threadIdx.x + j * kThreads]) : make_uint4(0, 0, 0, 0);
    if (valid[j]) PushUnit(x, c, row * row_units + threadIdx.x + j * kThreads, own[j]);
  }
  // Only now, with this rank's inputs loaded and sent, may a dependent
  // (the staged GEMV) start streaming its weights: earlier, its copies
  // delay those loads.
  AllowDependentLaunch();
  bool timed_out = false;
  const uint16_t* box = c.t.inbox[x.rank] + c.recv;
  float acc[B][8];
  SumBatch<B>(x, box, row * row_units + threadIdx.x, kThreads, valid, own, acc, timed_out);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    if (!valid[j]) continue;
    const int64_t k = threadIdx.x + j * kThreads;
    AddSum(a[j], b[j], acc[j], ss);
    res[2 * k] = a[j];
    res[2 * k + 1] = b[j];
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  uint4* o = reinterpret_cast<uint4*>(out + row * cols);
#pragma unroll
  for (int j = 0; j < B; ++j) {
    if (valid[j]) o[threadIdx.x + j * kThreads] = Normalized(a[j], b[j], inv, ga[j], gb[j]);
  }
  EndCall(x, c, static_cast<uint32_t>(gridDim.x * cols), timed_out);
}

__global__ void FillKernel(uint32_t* p, int64_t n, uint32_t value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = value;
  }
}

int CtasFor(int64_t count) {
  const int64_t ctas = (count * 2 + kBytesPerCta - 1) / kBytesPerCta;
  return static_cast<int>(std::clamp<int64_t>(ctas, 1, kMaxCtas));
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<P2pAllReduce>> P2pAllReduce::Create(const std::vector<int>& ordinals,
                                                                   int64_t max_count) {
  const int n = static_cast<int>(ordinals.size());
  if (n < 2 || n > kMaxRanks) {
    return absl::InvalidArgumentError("P2pAllReduce needs 2 to 8 devices");
  }
  if (max_count < 1 || max_count > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError("P2pAllReduce: max_count must be in [1, 2^30]");
  }
  std::unique_ptr<P2pAllReduce> g(new P2pAllReduce);
  g->ordinals_ = ordinals;
  g->max_count_ = max_count;
  g->cap_ = (max_count + 7) / 8 * 8;
  for (int a = 0; a < n; ++a) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals[a]));
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, ordinals[a], ordinals[b]));
      if (!can) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", ordinals[a], " cannot access device ", ordinals[b], "'s memory"));
      }
      const cudaError_t err = cudaDeviceEnablePeerAccess(ordinals[b], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (err != cudaSuccess) {
        return CudaError(err, "cudaDeviceEnablePeerAccess");
      }
    }
    for (auto* list : {&g->inbox_, &g->state_, &g->tables_}) list->emplace_back();
    const int64_t inbox_values = int64_t{kBuffers} * n * g->cap_;
    const size_t sizes[] = {static_cast<size_t>(inbox_values) * sizeof(uint16_t),
                            kStateWords * sizeof(uint32_t), sizeof(PeerTable)};
    DeviceBuffer* bufs[] = {&g->inbox_[a], &g->state_[a], &g->tables_[a]};
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(sizes[i]);
      if (!b.ok()) return b.status();
      TESSERA_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, sizes[i]));
      *bufs[i] = std::move(*b);
    }
    // Every inbox slot starts empty (bf16 -0.0).
    FillKernel<<<256, 256>>>(g->inbox_[a].as<uint32_t>(), inbox_values / 2, kEmptyPair);
    TESSERA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // One host-mapped word per rank, which a call that gave up sets: the
  // host reads it after a step without a copy (TakeTimedOut).
  for (int r = 0; r < n; ++r) {
    void* host = nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    g->timed_out_.push_back(static_cast<uint32_t*>(host));
    *g->timed_out_.back() = 0;
    void* dev = nullptr;
    TESSERA_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, host, 0));
    g->timed_out_dev_.push_back(static_cast<uint32_t*>(dev));
  }
  PeerTable table{};
  for (int r = 0; r < n; ++r) table.inbox[r] = g->inbox_[r].as<uint16_t>();
  for (int r = 0; r < n; ++r) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals[r]));
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(g->tables_[r].data(), &table, sizeof(table), cudaMemcpyHostToDevice));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  return g;
}

absl::Status P2pAllReduce::CheckCall(int rank, int64_t count, bool null_data) const {
  if (rank < 0 || rank >= size()) return absl::InvalidArgumentError("P2P rank out of range");
  if (count < 0 || count > max_count_ || (count > 0 && null_data)) {
    return absl::InvalidArgumentError(
        absl::StrCat("P2P all-reduce of ", count, " values (at most ", max_count_, ")"));
  }
  return absl::OkStatus();
}

absl::Status P2pAllReduce::AllReduceSumBf16(int rank, Bf16* data, int64_t count,
                                            CudaStream stream) {
  if (absl::Status s = CheckCall(rank, count, data == nullptr); !s.ok()) return s;
  if (count == 0) return absl::OkStatus();
  const Exchange x{tables_[rank].as<const PeerTable>(),
                   state_[rank].as<uint32_t>(),
                   timed_out_dev_[rank],
                   cap_,
                   rank,
                   size()};
  uint16_t* d = reinterpret_cast<uint16_t*>(data);
  if (count % 8 == 0 && Aligned16(data)) {
    AllReduceKernel<true><<<CtasFor(count), kThreads, 0, AsCuda(stream)>>>(d, count, x);
  } else {
    AllReduceKernel<false><<<CtasFor(count), kThreads, 0, AsCuda(stream)>>>(d, count, x);
  }
  return CudaError(cudaGetLastError(), "P2P all-reduce");
}

bool P2pAllReduce::AddRmsNormSupports(const Bf16* delta, const float* residual, int64_t cols,
                                      const float* w, const Bf16* out) {
  return cols > 0 && cols % 8 == 0 && Aligned16(delta) && Aligned16(residual) && Aligned16(w) &&
         Aligned16(out);
}

absl::Status P2pAllReduce::AllReduceAddRmsNorm(int rank, const Bf16* delta, float* residual,
                                               int64_t rows, int64_t cols, const float* w,
                                               float eps, Bf16* out, CudaStream stream) {
  return LaunchRmsNorm(rank, delta, residual, rows, cols, w, eps, out, true, stream);
}

absl::Status P2pAllReduce::AllReduceRmsNorm(int rank, const Bf16* delta, float* residual,
                                            int64_t rows, int64_t cols, const float* w, float eps,
                                            Bf16* out, CudaStream stream) {
  return LaunchRmsNorm(rank, delta, residual, rows, cols, w, eps, out, false, stream);
}

absl::Status P2pAllReduce::LaunchRmsNorm(int rank, const Bf16* delta, float* residual, int64_t rows,
                                         int64_t cols, const float* w, float eps, Bf16* out,
                                         bool accumulate, CudaStream stream) {
  if (rows < 0 || cols <= 0 || rows > max_count_ / cols) {
    return absl::InvalidArgumentError(absl::StrCat("P2P all-reduce + RMSNorm of ", rows, " x ",
                                                   cols, " values (at most ", max_count_, ")"));
  }
  if (absl::Status s = CheckCall(rank, rows * cols, false); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (delta == nullptr || residual == nullptr || w == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("P2P all-reduce + RMSNorm: null pointer");
  }
  if (!AddRmsNormSupports(delta, residual, cols, w, out)) {
    return absl::InvalidArgumentError(absl::StrCat("P2P all-reduce + RMSNorm needs cols % 8 == 0 (",
                                                   cols, ") and 16-byte-aligned buffers"));
  }
  const Exchange x{tables_[rank].as<const PeerTable>(),
                   state_[rank].as<uint32_t>(),
                   timed_out_dev_[rank],
                   cap_,
                   rank,
                   size()};
  const int ctas = static_cast<int>(std::min<int64_t>(rows, kMaxCtas));  // a row per CTA
  if (rows <= kMaxCtas && cols <= int64_t{8} * kRowBatch * kThreads) {
    return CudaError(
        LaunchDependent(AllReduceAddRmsNormRowKernel, ctas, kThreads, 0, AsCuda(stream),
                        reinterpret_cast<const uint16_t*>(delta), residual, cols, w, eps,
                        reinterpret_cast<uint16_t*>(out), accumulate, x),
        "P2P all-reduce + RMSNorm");
  }
  AllReduceAddRmsNormKernel<<<ctas, kThreads, 0, AsCuda(stream)>>>(
      reinterpret_cast<const uint16_t*>(delta), residual, rows, cols, w, eps,
      reinterpret_cast<uint16_t*>(out), accumulate, x);
  return CudaError(cudaGetLastError(), "P2P all-reduce + RMSNorm");
}

P2pAllReduce::~P2pAllReduce() {
  for (uint32_t* h : timed_out_) cudaFreeHost(h);
}

bool P2pAllReduce::TakeTimedOut(int rank) {
  if (rank < 0 || rank >= size()) return false;
  volatile uint32_t* flag = timed_out_[rank];
  const bool timed_out = *flag != 0;
  *flag = 0;
  return timed_out;
}

absl::StatusOr<uint32_t> P2pAllReduce::StateWord(int rank, int word) {
  if (rank < 0 || rank >= size()) return absl::InvalidArgumentError("P2P rank out of range");
  uint32_t value = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals_[rank]));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&value, state_[rank].as<uint32_t>() + word, sizeof(value),
                                          cudaMemcpyDeviceToHost));
  return value;
}

absl::StatusOr<uint32_t> P2pAllReduce::CallIndex(int rank) { return StateWord(rank, kBuffer); }

absl::StatusOr<uint32_t> P2pAllReduce::Timeouts(int rank) { return StateWord(rank, kTimeouts); }

}  // namespace tessera::kernels::cuda
