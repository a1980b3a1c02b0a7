// Embedding, RMSNorm, SiLU-mul, row gather and KV-cache write kernels (see
// embedding.h, rmsnorm.h, silu_mul.h, gather_rows.h, kv_cache_write.h).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gather_rows.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/silu_mul.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int64_t kMaxGridX = 2147483647;

absl::Status CheckRows(int64_t rows, std::string_view op) {
  if (rows > kMaxGridX) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(op), ": ", rows, " rows exceed the grid limit 2^31-1"));
  }
  return absl::OkStatus();
}

// ---- embedding ----

// VEC: 8 bf16 (16 bytes) in, two float4 (fp32 out) or one 16-byte vector
// (bf16 out) out.
template <bool VEC, class OutT>
__global__ void EmbeddingKernel(const uint16_t* __restrict__ table, int64_t vocab, int64_t hidden,
                                const int32_t* __restrict__ ids, OutT* __restrict__ out) {
  constexpr bool kF32 = std::is_same_v<OutT, float>;
  const int64_t row = blockIdx.x;
  const int32_t id = ids[row];
  OutT* dst = out + row * hidden;
  const bool valid = id >= 0 && id < vocab;
  const uint16_t* src = table + (valid ? static_cast<int64_t>(id) * hidden : 0);
  if constexpr (VEC) {
    const int64_t chunks = hidden / 8;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 v = valid ? reinterpret_cast<const uint4*>(src)[c] : make_uint4(0, 0, 0, 0);
      if constexpr (kF32) {
        reinterpret_cast<float4*>(dst)[2 * c] =
            make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                        __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
        reinterpret_cast<float4*>(dst)[2 * c + 1] =
            make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                        __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
      } else {
        reinterpret_cast<uint4*>(dst)[c] = v;
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      const uint16_t v = valid ? src[i] : uint16_t{0};
      if constexpr (kF32) {
        dst[i] = Bf16BitsToFloat(v);
      } else {
        dst[i] = v;
      }
    }
  }
}

// ---- rmsnorm ----

constexpr int kRegChunks = 4;  // float4 chunks per thread kept in registers (RmsNormKernel)

template <bool VEC, bool FUSED>
// `out` may alias `delta` (each thread reads its delta elements before it
// writes the same elements of out), hence no __restrict__ on those two.
__global__ void RmsNormKernel(const float* __restrict__ x, const uint16_t* delta,
                              float* __restrict__ residual, int64_t cols,
                              const float* __restrict__ w, float eps, uint16_t* out) {
  AllowDependentLaunch();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* in = FUSED ? residual + row * cols : x + row * cols;
  float* res = FUSED ? residual + row * cols : nullptr;
  const uint16_t* d = FUSED ? delta + row * cols : nullptr;
  uint16_t* o = out + row * cols;
  float ss = 0.f;
  // Launched as a programmatic dependent (LaunchDependent): the fused form
  // with its row in registers reads the residual and weights before the
  // kernel before it ends (the rmsnorm.h contract), everything else waits
  // first.
  const bool in_registers = VEC && cols / 4 <= kRegChunks * static_cast<int64_t>(blockDim.x);
  if (!FUSED || !in_registers) WaitForPrimary();
  if constexpr (VEC) {
    const int64_t n4 = cols / 4;
    if (in_registers) {
      // Each thread's chunks (at most kRegChunks) stay in registers, and the
      // weights are read up front with the inputs: one memory round trip
      // before the reduction instead of three (a decode step's 1-row norms
      // are pure latency). Same per-thread order, so the same sums.
      float4 v[kRegChunks], g[kRegChunks];
#pragma unroll
      for (int j = 0; j < kRegChunks; ++j) {
        const int64_t c = threadIdx.x + int64_t{j} * blockDim.x;
        if (c >= n4) continue;
        v[j] = reinterpret_cast<const float4*>(in)[c];
        g[j] = reinterpret_cast<const float4*>(w)[c];
      }
      if constexpr (FUSED) WaitForPrimary();
#pragma unroll
      for (int j = 0; j < kRegChunks; ++j) {
        const int64_t c = threadIdx.x + int64_t{j} * blockDim.x;
        if (c >= n4) continue;
        if constexpr (FUSED) {
          const uint2 dv = reinterpret_cast<const uint2*>(d)[c];
          v[j].x += __uint_as_float(dv.x << 16);
          v[j].y += __uint_as_float(dv.x & 0xffff0000u);
          v[j].z += __uint_as_float(dv.y << 16);
          v[j].w += __uint_as_float(dv.y & 0xffff0000u);
          reinterpret_cast<float4*>(res)[c] = v[j];
        }
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
      }
      ss = BlockSum(ss, scratch);
      const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
#pragma unroll
      for (int j = 0; j < kRegChunks; ++j) {
        const int64_t c = threadIdx.x + int64_t{j} * blockDim.x;
        if (c >= n4) continue;
        uint2 packed;
        packed.x = static_cast<uint32_t>(FloatToBf16Bits(v[j].x * inv * g[j].x)) |
                   (static_cast<uint32_t>(FloatToBf16Bits(v[j].y * inv * g[j].y)) << 16);
        packed.y = static_cast<uint32_t>(FloatToBf16Bits(v[j].z * inv * g[j].z)) |
                   (static_cast<uint32_t>(FloatToBf16Bits(v[j].w * inv * g[j].w)) << 16);
        reinterpret_cast<uint2*>(o)[c] = packed;
      }
      return;
    }
    for (int64_t c = threadIdx.x; c < n4; c += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(in)[c];
      if constexpr (FUSED) {
        const uint2 dv = reinterpret_cast<const uint2*>(d)[c];
        v.x += __uint_as_float(dv.x << 16);
        v.y += __uint_as_float(dv.x & 0xffff0000u);
        v.z += __uint_as_float(dv.y << 16);
        v.w += __uint_as_float(dv.y & 0xffff0000u);
        reinterpret_cast<float4*>(res)[c] = v;
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      float v = in[i];
      if constexpr (FUSED) {
        v += Bf16BitsToFloat(d[i]);
        res[i] = v;
      }
      ss += v * v;
    }
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  // Each thread re-reads exactly the elements it wrote above: no race.
  if constexpr (VEC) {
    const int64_t n4 = cols / 4;
    for (int64_t c = threadIdx.x; c < n4; c += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(in)[c];
      const float4 g = reinterpret_cast<const float4*>(w)[c];
      uint2 packed;
      packed.x = static_cast<uint32_t>(FloatToBf16Bits(v.x * inv * g.x)) |
                 (static_cast<uint32_t>(FloatToBf16Bits(v.y * inv * g.y)) << 16);
      packed.y = static_cast<uint32_t>(FloatToBf16Bits(v.z * inv * g.z)) |
                 (static_cast<uint32_t>(FloatToBf16Bits(v.w * inv * g.w)) << 16);
      reinterpret_cast<uint2*>(o)[c] = packed;
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      o[i] = FloatToBf16Bits(in[i] * inv * w[i]);
    }
  }
}

int RowThreads(int64_t work_items) {
  int64_t t = (work_items + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(t, 32, 1024));
}

absl::Status LaunchRmsNorm(const float* x, const Bf16* delta, float* residual, int64_t rows,
                           int64_t cols, const float* w, float eps, Bf16* out, CudaStream stream,
                           bool fused) {
  const char* op = fused ? "FusedAddRmsNorm" : "RmsNorm";
  if (rows < 0 || cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bad shape rows=", rows, " cols=", cols));
  }
  if (rows == 0) return absl::OkStatus();
  if ((fused ? (delta == nullptr || residual == nullptr) : x == nullptr) || w == nullptr ||
      out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null pointer"));
  }
  if (absl::Status s = CheckRows(rows, op); !s.ok()) return s;
  const bool vec = cols % 4 == 0 && Aligned(fused ? residual : x, 16) && Aligned(w, 16) &&
                   Aligned(out, 8) && (!fused || Aligned(delta, 8));
  const int threads = RowThreads(vec ? cols / 4 : cols);
  const dim3 grid(static_cast<unsigned>(rows));
  const cudaStream_t s = AsCuda(stream);
  const uint16_t* d = delta;
  auto* kernel = fused ? (vec ? RmsNormKernel<true, true> : RmsNormKernel<false, true>)
                       : (vec ? RmsNormKernel<true, false> : RmsNormKernel<false, false>);
  TESSERA_CUDA_RETURN_IF_ERROR(LaunchDependent(kernel, grid, threads, 0, s, fused ? nullptr : x, d,
                                               fused ? residual : nullptr, cols, w, eps, out));
  return CheckLastLaunch(op);
}

// ---- silu_mul ----

// Two packed bf16 gate values and their two up values -> two packed bf16
// silu(gate) * up.
__device__ __forceinline__ uint32_t SiluTimesPair(uint32_t g, uint32_t u) {
  const float lo = SiluTimes(__uint_as_float(g << 16), __uint_as_float(u << 16));
  const float hi = SiluTimes(__uint_as_float(g & 0xffff0000u), __uint_as_float(u & 0xffff0000u));
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) |
         (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
}

// Grid-stride over rows * (inter / width) chunks.
template <bool VEC>
__global__ void SiluMulKernel(const uint16_t* __restrict__ gate_up, int64_t rows, int64_t inter,
                              uint16_t* __restrict__ out) {
  const int64_t width = VEC ? 8 : 1;
  const int64_t per_row = inter / width;
  const int64_t total = rows * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row;
    const int64_t c = idx - r * per_row;
    const uint16_t* g = gate_up + r * 2 * inter;
    const uint16_t* u = g + inter;
    if constexpr (VEC) {
      const uint4 gv = reinterpret_cast<const uint4*>(g)[c];
      const uint4 uv = reinterpret_cast<const uint4*>(u)[c];
      const uint32_t ga[4] = {gv.x, gv.y, gv.z, gv.w};
      const uint32_t ua[4] = {uv.x, uv.y, uv.z, uv.w};
      uint32_t res[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) res[j] = SiluTimesPair(ga[j], ua[j]);
      reinterpret_cast<uint4*>(out + r * inter)[c] = make_uint4(res[0], res[1], res[2], res[3]);
    } else {
      out[r * inter + c] = FloatToBf16Bits(SiluTimes(Bf16BitsToFloat(g[c]), Bf16BitsToFloat(u[c])));
    }
  }
}

// The gate/up rows in GEMV order (gemv.h GemvGateUpRow): every 8 columns
// hold gate j .. j + 3, then up j .. j + 3. One 16-byte load, 4 outputs.
__global__ void SiluMulInterleavedKernel(const uint16_t* __restrict__ gate_up, int64_t rows,
                                         int64_t inter, uint16_t* __restrict__ out) {
  const int64_t per_row = inter / 4;
  const int64_t total = rows * per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / per_row;
    const int64_t c = idx - r * per_row;
    const uint4 v = reinterpret_cast<const uint4*>(gate_up + r * 2 * inter)[c];
    const uint32_t g[2] = {v.x, v.y}, u[2] = {v.z, v.w};
    uint32_t res[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) res[j] = SiluTimesPair(g[j], u[j]);
    reinterpret_cast<uint2*>(out + r * inter)[c] = make_uint2(res[0], res[1]);
  }
}

int GridFor(int64_t items, int threads) {
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, 65535 * 16));
}

// ---- gather rows ----

template <bool VEC>
__global__ void GatherRowsKernel(const uint16_t* __restrict__ x, int64_t x_rows, int64_t cols,
                                 const int32_t* __restrict__ rows, uint16_t* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  const bool valid = r >= 0 && r < x_rows;
  const uint16_t* src = x + (valid ? static_cast<int64_t>(r) * cols : 0);
  uint16_t* dst = out + i * cols;
  if constexpr (VEC) {
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[c] =
          valid ? reinterpret_cast<const uint4*>(src)[c] : make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = valid ? src[c] : 0;
  }
}

// ---- kv cache write ----

// One block per token; each thread copies 8-element (VEC) or single-element
// pieces of the token's kv_heads * head_dim K and V values.
template <bool VEC>
__global__ void WriteKvCacheKernel(const uint16_t* __restrict__ k, int64_t k_stride,
                                   const uint16_t* __restrict__ v, int64_t v_stride,
                                   int64_t row_elems, const int64_t* __restrict__ slots,
                                   uint16_t* __restrict__ k_cache, uint16_t* __restrict__ v_cache,
                                   int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const uint16_t* ks = k + t * k_stride;
  const uint16_t* vs = v + t * v_stride;
  uint16_t* kd = k_cache + slot * row_elems;
  uint16_t* vd = v_cache + slot * row_elems;
  if constexpr (VEC) {
    for (int64_t c = threadIdx.x; c < row_elems / 8; c += blockDim.x) {
      reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
      reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
    }
  } else {
    for (int64_t c = threadIdx.x; c < row_elems; c += blockDim.x) {
      kd[c] = ks[c];
      vd[c] = vs[c];
    }
  }
}

template <class OutT>
absl::Status LaunchEmbedding(const Bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                             int64_t n, OutT* out, CudaStream stream) {
  if (vocab <= 0 || hidden <= 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Embedding: bad shape vocab=", vocab, " hidden=", hidden, " n=", n));
  }
  if (n == 0) return absl::OkStatus();
  if (table == nullptr || ids == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("Embedding: null pointer");
  }
  if (absl::Status s = CheckRows(n, "Embedding"); !s.ok()) return s;
  const bool vec = hidden % 8 == 0 && Aligned(table, 16) && Aligned(out, 16);
  const int threads = RowThreads(vec ? hidden / 8 : hidden);
  const dim3 grid(static_cast<unsigned>(n));
  const auto* t = reinterpret_cast<const uint16_t*>(table);
  if (vec) {
    EmbeddingKernel<true, OutT><<<grid, threads, 0, AsCuda(stream)>>>(t, vocab, hidden, ids, out);
  } else {
    EmbeddingKernel<false, OutT><<<grid, threads, 0, AsCuda(stream)>>>(t, vocab, hidden, ids, out);
  }
  return CheckLastLaunch("Embedding");
}

}  // namespace

absl::Status Embedding(const Bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                       int64_t n, float* out, CudaStream stream) {
  return LaunchEmbedding(table, vocab, hidden, ids, n, out, stream);
}

absl::Status EmbeddingBf16(const Bf16* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                           int64_t n, Bf16* out, CudaStream stream) {
  return LaunchEmbedding(table, vocab, hidden, ids, n, reinterpret_cast<uint16_t*>(out), stream);
}

absl::Status RmsNorm(const float* x, int64_t rows, int64_t cols, const float* w, float eps,
                     Bf16* out, CudaStream stream) {
  return LaunchRmsNorm(x, nullptr, nullptr, rows, cols, w, eps, out, stream, /*fused=*/false);
}

absl::Status FusedAddRmsNorm(const Bf16* delta, float* residual, int64_t rows, int64_t cols,
                             const float* w, float eps, Bf16* out, CudaStream stream) {
  return LaunchRmsNorm(nullptr, delta, residual, rows, cols, w, eps, out, stream, /*fused=*/true);
}

absl::Status SiluMul(const Bf16* gate_up, int64_t rows, int64_t inter, Bf16* out, CudaStream stream,
                     bool interleaved) {
  if (rows < 0 || inter <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SiluMul: bad shape rows=", rows, " inter=", inter));
  }
  if (rows == 0) return absl::OkStatus();
  if (gate_up == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("SiluMul: null pointer");
  }
  constexpr int kThreads = 256;
  if (interleaved) {
    if (inter % 4 != 0 || !Aligned(gate_up, 16) || !Aligned(out, 8)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SiluMul: interleaved gate/up needs inter % 4 == 0 and aligned rows (inter=", inter,
          ")"));
    }
    SiluMulInterleavedKernel<<<GridFor(rows * inter / 4, kThreads), kThreads, 0, AsCuda(stream)>>>(
        gate_up, rows, inter, out);
    return CheckLastLaunch("SiluMul");
  }
  const bool vec = inter % 8 == 0 && Aligned(gate_up, 16) && Aligned(out, 16);
  const int64_t items = rows * (vec ? inter / 8 : inter);
  const int grid = GridFor(items, kThreads);
  if (vec) {
    SiluMulKernel<true><<<grid, kThreads, 0, AsCuda(stream)>>>(gate_up, rows, inter, out);
  } else {
    SiluMulKernel<false><<<grid, kThreads, 0, AsCuda(stream)>>>(gate_up, rows, inter, out);
  }
  return CheckLastLaunch("SiluMul");
}

absl::Status GatherRows(const Bf16* x, int64_t x_rows, int64_t cols, const int32_t* rows, int64_t n,
                        Bf16* out, CudaStream stream) {
  if (x_rows < 0 || cols <= 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GatherRows: bad shape x_rows=", x_rows, " cols=", cols, " n=", n));
  }
  if (n == 0) return absl::OkStatus();
  if ((x == nullptr && x_rows > 0) || rows == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("GatherRows: null pointer");
  }
  if (absl::Status s = CheckRows(n, "GatherRows"); !s.ok()) return s;
  const bool vec = cols % 8 == 0 && Aligned(x, 16) && Aligned(out, 16);
  const int threads = RowThreads(vec ? cols / 8 : cols);
  const dim3 grid(static_cast<unsigned>(n));
  if (vec) {
    GatherRowsKernel<true><<<grid, threads, 0, AsCuda(stream)>>>(x, x_rows, cols, rows, out);
  } else {
    GatherRowsKernel<false><<<grid, threads, 0, AsCuda(stream)>>>(x, x_rows, cols, rows, out);
  }
  return CheckLastLaunch("GatherRows");
}

absl::Status WriteKvCache(const Bf16* k, int64_t k_token_stride, const Bf16* v,
                          int64_t v_token_stride, int64_t tokens, int num_kv_heads, int head_dim,
                          const int64_t* slot_mapping, Bf16* k_cache, Bf16* v_cache,
                          int64_t num_slots, CudaStream stream) {
  const int64_t row = int64_t{num_kv_heads} * head_dim;
  if (tokens < 0 || num_kv_heads <= 0 || head_dim <= 0 || num_slots < 0 || k_token_stride < row ||
      v_token_stride < row) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKvCache: bad shape tokens=", tokens, " kv_heads=", num_kv_heads,
                     " head_dim=", head_dim, " num_slots=", num_slots, " k_stride=", k_token_stride,
                     " v_stride=", v_token_stride));
  }
  if (tokens == 0 || num_slots == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || slot_mapping == nullptr || k_cache == nullptr ||
      v_cache == nullptr) {
    return absl::InvalidArgumentError("WriteKvCache: null pointer");
  }
  if (absl::Status s = CheckRows(tokens, "WriteKvCache"); !s.ok()) return s;
  const bool vec = row % 8 == 0 && k_token_stride % 8 == 0 && v_token_stride % 8 == 0 &&
                   Aligned(k, 16) && Aligned(v, 16) && Aligned(k_cache, 16) && Aligned(v_cache, 16);
  const int threads = RowThreads(vec ? row / 8 : row);
  const dim3 grid(static_cast<unsigned>(tokens));
  if (vec) {
    WriteKvCacheKernel<true><<<grid, threads, 0, AsCuda(stream)>>>(
        k, k_token_stride, v, v_token_stride, row, slot_mapping, k_cache, v_cache, num_slots);
  } else {
    WriteKvCacheKernel<false><<<grid, threads, 0, AsCuda(stream)>>>(
        k, k_token_stride, v, v_token_stride, row, slot_mapping, k_cache, v_cache, num_slots);
  }
  return CheckLastLaunch("WriteKvCache");
}

}  // namespace tessera::kernels::cuda
