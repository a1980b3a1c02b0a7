// RoPE with optional fused per-head RMSNorm and KV-cache write (see rope.h).
// Grid (token, head group): one warp per head (q heads, then k heads, then
// the v heads copied to the cache), a few blocks per token so that a decode
// step's handful of tokens still spreads over several SMs; each lane holds
// pairs i = lane + 32 j of the head in registers.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxHeadDim = 512;
constexpr int kMaxPairsPerLane = kMaxHeadDim / 2 / 32;  // 8
constexpr int kWarpsPerBlock = 8;

__global__ void RopeKernel(uint16_t* __restrict__ q, int64_t q_stride, int num_heads,
                           uint16_t* __restrict__ k, int64_t k_stride, int num_kv_heads,
                           int head_dim, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, const float* __restrict__ q_norm,
                           const float* __restrict__ k_norm, float eps, RopeKvWrite kv,
                           bool rope_order) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  const int q_heads = q != nullptr ? num_heads : 0;
  const int k_heads = k != nullptr ? num_kv_heads : 0;
  // KV-cache destination of this token (none without kv or for a bad slot).
  const int64_t row_elems = int64_t{num_kv_heads} * head_dim;
  const int64_t slot = kv.slots != nullptr ? kv.slots[t] : -1;
  const bool store = slot >= 0 && slot < kv.num_slots;
  uint16_t* k_dst = store ? kv.k_cache + slot * row_elems : nullptr;
  // Tasks: the q heads, the k heads, then (when storing) the v heads, one
  // warp each, spread over the token's gridDim.y blocks.
  const int rotate = q_heads + k_heads;
  const int tasks = rotate + (store ? num_kv_heads : 0);
  for (int h = blockIdx.y * kWarpsPerBlock + warp; h < tasks; h += gridDim.y * kWarpsPerBlock) {
    if (h >= rotate) {  // V: copied as is
      const int64_t off = static_cast<int64_t>(h - rotate) * head_dim;
      const uint16_t* v_src = kv.v + t * kv.v_token_stride + off;
      uint16_t* v_dst = kv.v_cache + slot * row_elems + off;
      for (int i = lane; i < head_dim; i += 32) v_dst[i] = v_src[i];
      continue;
    }
    const bool is_q = h < q_heads;
    uint16_t* head = is_q ? q + t * q_stride + static_cast<int64_t>(h) * head_dim
                          : k + t * k_stride + static_cast<int64_t>(h - q_heads) * head_dim;
    const float* norm = is_q ? q_norm : k_norm;
    float x1[kMaxPairsPerLane], x2[kMaxPairsPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      x1[j] = 0.f;
      x2[j] = 0.f;
      if (i < half) {
        // In RoPE row order, feature i sits in 8-row group i / 4 at i % 4
        // and its partner i + half 4 rows after it (gemv.h GemvRopeRow).
        const int i1 = rope_order ? (i / 4) * 8 + i % 4 : i;
        const int i2 = rope_order ? i1 + 4 : i + half;
        x1[j] = Bf16BitsToFloat(head[i1]);
        x2[j] = Bf16BitsToFloat(head[i2]);
      }
    }
    float inv = 1.f;
    if (norm != nullptr) {
      // The squares in the order decode attention's DecodeRope adds them
      // (paged_attention.cu RotateItem), so that both agree bit for bit:
      // lane l takes pairs 8l .. 8l+7 in order, then the warp's tree.
      float ss = 0.f;
      for (int i = 8 * lane; i < min(half, 8 * lane + 8); ++i) {
        ss = AddPairSquares(ss, Bf16BitsToFloat(head[i]), Bf16BitsToFloat(head[i + half]));
      }
      inv = HeadInvRms(WarpSum(ss), head_dim, eps);
    }
    __syncwarp();  // every lane's reads of the head before any lane writes it
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        float a = x1[j], b = x2[j];
        if (norm != nullptr) {
          a = NormScale(a, inv, norm[i]);
          b = NormScale(b, inv, norm[i + half]);
        }
        uint16_t lo, hi;
        RopeRotate(a, b, pos, inv_freq[i], &lo, &hi);
        head[i] = lo;
        head[i + half] = hi;
        if (!is_q && k_dst != nullptr) {
          uint16_t* d = k_dst + static_cast<int64_t>(h - q_heads) * head_dim;
          d[i] = lo;
          d[i + half] = hi;
        }
      }
    }
  }
}

}  // namespace

absl::Status Rope(Bf16* q, int64_t q_token_stride, int num_heads, Bf16* k, int64_t k_token_stride,
                  int num_kv_heads, int head_dim, const int32_t* positions, int64_t tokens,
                  const float* inv_freq, const float* q_norm, const float* k_norm, float norm_eps,
                  CudaStream stream, const RopeKvWrite* kv, bool rope_order) {
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: head_dim must be even and in [2, 512], got ", head_dim));
  }
  if (tokens < 0 ||
      (q != nullptr && (num_heads <= 0 || q_token_stride < int64_t{num_heads} * head_dim)) ||
      (k != nullptr && (num_kv_heads <= 0 || k_token_stride < int64_t{num_kv_heads} * head_dim))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rope: bad shape tokens=", tokens, " heads=", num_heads, " kv_heads=", num_kv_heads,
        " head_dim=", head_dim, " q_stride=", q_token_stride, " k_stride=", k_token_stride));
  }
  if (tokens == 0 || (q == nullptr && k == nullptr)) return absl::OkStatus();
  if (positions == nullptr || inv_freq == nullptr) {
    return absl::InvalidArgumentError("Rope: null positions or inv_freq");
  }
  if (tokens > 2147483647) return absl::InvalidArgumentError("Rope: too many tokens");
  if (rope_order && (head_dim % 16 != 0 || q_norm != nullptr || k_norm != nullptr)) {
    return absl::InvalidArgumentError(
        "Rope: RoPE-ordered input needs head_dim % 16 == 0 and no q/k norms");
  }
  RopeKvWrite store;
  if (kv != nullptr && kv->num_slots > 0) {
    if (k == nullptr || kv->v == nullptr || kv->slots == nullptr || kv->k_cache == nullptr ||
        kv->v_cache == nullptr || kv->v_token_stride < int64_t{num_kv_heads} * head_dim) {
      return absl::InvalidArgumentError(
          "Rope: the KV-cache write needs k, v (with a stride of at least one row), slots and both "
          "caches");
    }
    store = *kv;
  }
  const int tasks = (q != nullptr ? num_heads : 0) + (k != nullptr ? num_kv_heads : 0) +
                    (store.slots != nullptr ? num_kv_heads : 0);
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((tasks + kWarpsPerBlock - 1) / kWarpsPerBlock));
  RopeKernel<<<grid, kWarpsPerBlock * 32, 0, AsCuda(stream)>>>(
      q, q_token_stride, num_heads, k, k_token_stride, num_kv_heads, head_dim, positions, inv_freq,
      q_norm, k_norm, norm_eps, store, rope_order);
  return CheckLastLaunch("Rope");
}

}  // namespace tessera::kernels::cuda
