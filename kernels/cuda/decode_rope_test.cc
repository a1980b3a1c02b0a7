// Decode attention with RoPE and the K/V write fused in (paged_attention.h
// DecodeRope) against the two-launch path it replaces: rope.h's Rope (with
// the KV-cache write) on the same qkv rows, then PagedAttentionDecode. The
// attention output and both caches must be equal bit for bit, for q/k rows
// in the normal and in the qkv GEMV's RoPE order (and, in the normal
// order, with Qwen3's per-head q/k norms before RoPE), head dims 64 / 128,
// group sizes 4 and 20 (two query-row blocks per kv head), contexts that
// put the new key in the first tile, a later tile or a later split, grids
// on both sides of the small-tile threshold, and a token whose slot is
// outside the cache (not written by either path). Skipped without a device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/rope.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::Upload;

struct Shape {
  int head_dim, heads, kv_heads;
  bool rope_order;
  std::vector<int> seq_lens;
  bool norms = false;  // q/k norms (normal order only)
};

uint16_t RandomBf16(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  const float f = normal(rng);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

void CheckFusedEqualsTwoLaunches(const Shape& sh, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "d " << sh.head_dim << " heads " << sh.heads << "/" << sh.kv_heads
               << (sh.rope_order ? " rope order" : "") << (sh.norms ? " q/k norms" : "") << " seqs "
               << sh.seq_lens.size());
  std::mt19937 rng(seed);
  const int d = sh.head_dim, bs = 16;
  const int seqs = static_cast<int>(sh.seq_lens.size());
  const int longest = *std::max_element(sh.seq_lens.begin(), sh.seq_lens.end());
  const int table_stride = (longest + bs - 1) / bs;
  const int64_t num_slots = int64_t{seqs} * table_stride * bs;
  const int64_t row = int64_t{sh.kv_heads} * d;
  const int64_t q_cols = int64_t{sh.heads} * d, qkv_cols = q_cols + 2 * row;

  // Blocks of the sequences in a shuffled order; caches full of random values
  // (the new keys' rows too: both paths must overwrite them).
  std::vector<int32_t> blocks(static_cast<size_t>(seqs) * table_stride);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<uint16_t> k_cache(num_slots * row), v_cache(num_slots * row);
  for (uint16_t& x : k_cache) x = RandomBf16(rng);
  for (uint16_t& x : v_cache) x = RandomBf16(rng);
  std::vector<uint16_t> qkv(static_cast<size_t>(seqs) * qkv_cols);
  for (uint16_t& x : qkv) x = RandomBf16(rng);
  std::vector<int32_t> positions(seqs);
  std::vector<int64_t> slots(seqs);
  for (int s = 0; s < seqs; ++s) {
    const int pos = sh.seq_lens[s] - 1;
    positions[s] = pos + 37 * s;  // RoPE positions need not equal cache positions
    slots[s] = int64_t{blocks[s * table_stride + pos / bs]} * bs + pos % bs;
  }
  slots[seqs / 2] = -1;  // not written by either path
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    inv_freq[i] = std::pow(10000.f, -2.f * static_cast<float>(i) / static_cast<float>(d));
  }

  std::vector<float> q_norm(d), k_norm(d);
  std::uniform_real_distribution<float> weight(0.5f, 1.5f);
  for (int i = 0; i < d; ++i) {
    q_norm[i] = weight(rng);
    k_norm[i] = weight(rng);
  }
  DeviceBuffer d_q_norm = Upload(q_norm), d_k_norm = Upload(k_norm);
  const float* qn = sh.norms ? d_q_norm.as<float>() : nullptr;
  const float* kn = sh.norms ? d_k_norm.as<float>() : nullptr;
  const float eps = 1e-6f;
  DeviceBuffer d_blocks = Upload(blocks), d_lens = Upload(sh.seq_lens);
  DeviceBuffer d_positions = Upload(positions), d_slots = Upload(slots);
  DeviceBuffer d_inv_freq = Upload(inv_freq);
  const size_t ws_bytes = PagedAttentionDecodeWorkspaceBytes(seqs, sh.heads, d, longest);
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(std::max<size_t>(ws_bytes, 16));
  ASSERT_TRUE(ws.ok());

  struct Run {
    DeviceBuffer qkv, k_cache, v_cache, out;
  };
  auto attend = [&](bool fused) {
    Run r{Upload(qkv), Upload(k_cache), Upload(v_cache),
          Upload(std::vector<uint16_t>(static_cast<size_t>(seqs) * q_cols, 0))};
    uint16_t* q = r.qkv.as<uint16_t>();
    DecodeRope rope;
    rope.positions = d_positions.as<int32_t>();
    rope.inv_freq = d_inv_freq.as<float>();
    rope.rope_order = sh.rope_order;
    rope.k = q + q_cols;
    rope.v = q + q_cols + row;
    rope.kv_token_stride = qkv_cols;
    rope.slots = d_slots.as<int64_t>();
    rope.num_slots = num_slots;
    rope.k_cache = r.k_cache.as<uint16_t>();
    rope.v_cache = r.v_cache.as<uint16_t>();
    rope.q_norm = qn;
    rope.k_norm = kn;
    rope.norm_eps = eps;
    if (!fused) {
      RopeKvWrite kv;
      kv.v = rope.v;
      kv.v_token_stride = qkv_cols;
      kv.slots = rope.slots;
      kv.k_cache = rope.k_cache;
      kv.v_cache = rope.v_cache;
      kv.num_slots = num_slots;
      const absl::Status s =
          Rope(q, qkv_cols, sh.heads, q + q_cols, qkv_cols, sh.kv_heads, d, rope.positions, seqs,
               rope.inv_freq, qn, kn, eps, nullptr, &kv, sh.rope_order);
      EXPECT_TRUE(s.ok()) << s;
    }
    PagedAttentionParams p;
    p.q = q;
    p.q_token_stride = qkv_cols;
    p.k_cache = r.k_cache.as<uint16_t>();
    p.v_cache = r.v_cache.as<uint16_t>();
    p.block_tables = d_blocks.as<int32_t>();
    p.block_table_stride = table_stride;
    p.seq_lens = d_lens.as<int32_t>();
    p.num_seqs = seqs;
    p.num_heads = sh.heads;
    p.num_kv_heads = sh.kv_heads;
    p.head_dim = d;
    p.block_size = bs;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.max_seq_len = longest;
    p.out = r.out.as<uint16_t>();
    p.out_token_stride = q_cols;
    p.workspace = ws->data();
    p.workspace_bytes = ws->size();
    p.rope = fused ? &rope : nullptr;
    const absl::Status s = PagedAttentionDecode(p, nullptr);
    EXPECT_TRUE(s.ok()) << s;
    return r;
  };
  const Run want = attend(false);
  const Run got = attend(true);
  const size_t out_n = static_cast<size_t>(seqs) * q_cols;
  EXPECT_EQ(Download<uint16_t>(got.out, out_n), Download<uint16_t>(want.out, out_n));
  EXPECT_EQ(Download<uint16_t>(got.k_cache, k_cache.size()),
            Download<uint16_t>(want.k_cache, k_cache.size()));
  EXPECT_EQ(Download<uint16_t>(got.v_cache, v_cache.size()),
            Download<uint16_t>(want.v_cache, v_cache.size()));
}

TEST(DecodeRopeTest, FusedEqualsRopeThenAttention) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  uint32_t seed = 1;
  // New key in the first tile (1, 17, 64), a later tile (65, 200), a later
  // split (700 with few sequences).
  const std::vector<int> lens = {1, 17, 64, 65, 200, 700};
  for (const int d : {64, 128}) {
    // Normal order, normal order with q/k norms (Qwen3), RoPE order.
    for (const auto& [order, norms] : {std::pair{false, false}, {false, true}, {true, false}}) {
      CheckFusedEqualsTwoLaunches({d, 32, 8, order, lens, norms}, seed++);
      CheckFusedEqualsTwoLaunches({d, 20, 1, order, {3, 130, 64}, norms}, seed++);
      // Beyond one wave of 64-key CTAs: the 32-key tiles.
      std::vector<int> many;
      for (int s = 0; s < 400; ++s) many.push_back(1 + (s * 13) % 250);
      CheckFusedEqualsTwoLaunches({d, 32, 8, order, many, norms}, seed++);
    }
  }
}

}  // namespace
}  // namespace tessera::kernels::cuda
