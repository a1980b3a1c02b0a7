// Tests of the reference kernels themselves: small cases computed by hand,
// exact dtype conversions, and paged attention against a dense causal
// attention written independently of the paged layout.
#include "kernels/cpu/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::kernels::cpu {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + 0x1p-8f).bits, 0x3f80);      // halfway: stays even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);  // halfway: rounds up to even
  EXPECT_EQ(F32ToBf16(-2.5f).bits, 0xc020);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const bf16_t h{static_cast<uint16_t>(bits)};
    const float f = Bf16ToF32(h);
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBf16(f).bits, h.bits) << bits;
    }
  }
}

TEST(DTypeTest, F16ConversionsAreExact) {
  EXPECT_EQ(F32ToF16(1.0f).bits, 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f).bits, 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f).bits, 0x7c00);  // overflows to infinity
  EXPECT_EQ(F32ToF16(0x1p-24f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(0x1p-25f).bits, 0x0000);  // halfway to zero: even
  EXPECT_EQ(F32ToF16(3 * 0x1p-25f).bits, 0x0002);
  EXPECT_EQ(F16ToF32(fp16_t{0x0001}), 0x1p-24f);
  EXPECT_EQ(F16ToF32(fp16_t{0x3555}), 0.333251953125f);
  EXPECT_TRUE(std::isinf(F16ToF32(fp16_t{0xfc00})));
  EXPECT_TRUE(std::isnan(F16ToF32(fp16_t{0x7e00})));
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const fp16_t h{static_cast<uint16_t>(bits)};
    const float f = F16ToF32(h);
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToF16(f).bits, h.bits) << bits;
    }
  }
}

TEST(ReferenceTest, GemmByHandWithBias) {
  const std::vector<float> x = {1, 2, 3};
  std::vector<bf16_t> w;
  for (float v : {1.0f, 0.0f, -1.0f, 2.0f, 2.0f, 2.0f}) w.push_back(F32ToBf16(v));
  const std::vector<float> bias = {0.5f, -1.0f};
  std::vector<float> y(2);
  reference::Gemm(x.data(), 1, WeightMatrix{w.data(), DType::kBF16, 2, 3}, bias.data(), y.data());
  EXPECT_THAT(y, ElementsAre(-1.5f, 11.0f));
}

TEST(ReferenceTest, RmsNormByHand) {
  const std::vector<float> x = {3, 4};
  const std::vector<float> w = {1, 2};
  std::vector<float> out(2);
  reference::RmsNorm(x.data(), w.data(), 1, 2, 0.0f, out.data());
  const float rms = std::sqrt(12.5f);
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6f), {3 / rms, 8 / rms}));
}

TEST(ReferenceTest, FusedAddRmsNormKeepsTheSumAsResidual) {
  std::vector<float> x = {1, 1};
  std::vector<float> residual = {2, 3};
  const std::vector<float> w = {1, 1};
  reference::FusedAddRmsNorm(x.data(), residual.data(), w.data(), 1, 2, 0.0f);
  EXPECT_THAT(residual, ElementsAre(3.0f, 4.0f));
  const float rms = std::sqrt(12.5f);
  EXPECT_THAT(x, Pointwise(FloatNear(1e-6f), {3 / rms, 4 / rms}));
}

TEST(ReferenceTest, RopeRotatesPairsHalfAHeadApart) {
  // head_dim 4: pairs (0, 2) with frequency 1 and (1, 3) with frequency 0.5.
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  std::vector<float> q = {1, 1, 0, 0, /*token 1*/ 1, 1, 0, 0};
  std::vector<float> k = {0, 0, 1, 1, /*token 1*/ 0, 0, 1, 1};
  const std::vector<int32_t> positions = {0, 2};
  reference::Rope(positions, inv_freq, 4, q.data(), 1, 4, k.data(), 1, 4);
  // Position 0 is the identity.
  EXPECT_THAT(std::vector<float>(q.begin(), q.begin() + 4), ElementsAre(1, 1, 0, 0));
  EXPECT_THAT(std::vector<float>(k.begin(), k.begin() + 4), ElementsAre(0, 0, 1, 1));
  // Position 2: angles 2 and 1. (x, 0) -> (x cos, x sin); (0, y) -> (-y sin, y cos).
  EXPECT_THAT(std::vector<float>(q.begin() + 4, q.end()),
              Pointwise(FloatNear(1e-6f),
                        {std::cos(2.0f), std::cos(1.0f), std::sin(2.0f), std::sin(1.0f)}));
  EXPECT_THAT(std::vector<float>(k.begin() + 4, k.end()),
              Pointwise(FloatNear(1e-6f),
                        {-std::sin(2.0f), -std::sin(1.0f), std::cos(2.0f), std::cos(1.0f)}));
}

TEST(ReferenceTest, SiluMulByHand) {
  const std::vector<float> gate_up = {0.0f, 1.0f, /*up*/ 5.0f, 2.0f};
  std::vector<float> out(2);
  reference::SiluMul(gate_up.data(), 1, 2, out.data());
  EXPECT_THAT(out, Pointwise(FloatNear(1e-6f), {0.0f, 2.0f / (1.0f + std::exp(-1.0f))}));
}

TEST(ReferenceTest, SoftmaxLogSoftmaxArgmaxByHand) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.0f, std::log(3.0f), -inf};
  std::vector<float> p(3), lp(3);
  reference::Softmax(logits.data(), 1, 3, p.data());
  EXPECT_THAT(p, Pointwise(FloatNear(1e-7f), {0.25f, 0.75f, 0.0f}));
  reference::LogSoftmax(logits.data(), 1, 3, lp.data());
  EXPECT_NEAR(lp[0], std::log(0.25f), 1e-6f);
  EXPECT_NEAR(lp[1], std::log(0.75f), 1e-6f);
  EXPECT_EQ(lp[2], -inf);
  const std::vector<float> ties = {1, 7, 3, 7};
  int32_t best = -1;
  reference::Argmax(ties.data(), 1, 4, &best);
  EXPECT_EQ(best, 1);
}

TEST(ReferenceTest, ReduceSumAddsInOrder) {
  const std::vector<float> a = {1, 2}, b = {10, 20}, c = {100, 200};
  std::vector<float> out(2);
  reference::ReduceSum({a.data(), b.data(), c.data()}, 2, out.data());
  EXPECT_THAT(out, ElementsAre(111.0f, 222.0f));
}

// Dense causal attention for one sequence: K/V [seq_len, kv_heads, d], Q
// [q_len, heads, d]; query i sits at position seq_len - q_len + i.
std::vector<float> DenseCausalAttention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int seq_len, int q_len,
                                        int heads, int kv_heads, int d, float scale) {
  std::vector<float> out(static_cast<size_t>(q_len) * heads * d);
  const int group = heads / kv_heads;
  for (int i = 0; i < q_len; ++i) {
    const int position = seq_len - q_len + i;
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / group;
      // Full score row with an explicit mask, then a textbook softmax.
      std::vector<double> scores(seq_len);
      for (int j = 0; j < seq_len; ++j) {
        if (j > position) {
          scores[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int e = 0; e < d; ++e) {
          dot += double{q[(i * heads + h) * d + e]} * k[(j * kv_heads + kvh) * d + e];
        }
        scores[j] = dot * scale;
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double total = 0;
      for (double& s : scores) total += (s = std::exp(s - max_score));
      for (int e = 0; e < d; ++e) {
        double acc = 0;
        for (int j = 0; j < seq_len; ++j)
          acc += scores[j] / total * v[(j * kv_heads + kvh) * d + e];
        out[(i * heads + h) * d + e] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

TEST(ReferenceTest, PagedAttentionEqualsDenseCausalAttention) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  struct Case {
    int heads, kv_heads, d, block_size;
    std::vector<std::pair<int, int>> seqs;  // (seq_len, q_len)
  };
  for (const Case& c : {Case{4, 2, 16, 4, {{9, 9}, {13, 1}, {20, 6}}}, Case{3, 3, 8, 1, {{5, 2}}},
                        Case{8, 1, 32, 16, {{40, 40}, {17, 17}, {33, 1}}}}) {
    const int slot_stride = c.kv_heads * c.d;
    int total_blocks = 0;
    int max_blocks = 0;
    for (auto [len, q_len] : c.seqs) {
      total_blocks += (len + c.block_size - 1) / c.block_size;
      max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    }
    std::vector<int32_t> physical(total_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng);
    std::vector<float> k_cache(static_cast<size_t>(total_blocks) * c.block_size * slot_stride);
    std::vector<float> v_cache(k_cache.size());
    const PagedKvCache cache{k_cache.data(), v_cache.data(), total_blocks,
                             c.block_size,   c.kv_heads,     c.d};

    std::vector<int32_t> block_tables(c.seqs.size() * max_blocks, 0);
    std::vector<int32_t> seq_lens, query_start_loc = {0};
    std::vector<float> q_all, want_all;
    size_t next_block = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      auto [len, q_len] = c.seqs[s];
      const int blocks = (len + c.block_size - 1) / c.block_size;
      for (int b = 0; b < blocks; ++b) block_tables[s * max_blocks + b] = physical[next_block++];
      // Dense K/V for the whole sequence, written into the cache through the slot mapping.
      std::vector<float> k(static_cast<size_t>(len) * slot_stride), v(k.size());
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      std::vector<int64_t> slots(len);
      for (int p = 0; p < len; ++p) {
        slots[p] = int64_t{block_tables[s * max_blocks + p / c.block_size]} * c.block_size +
                   p % c.block_size;
      }
      ASSERT_TRUE(
          reference::WriteKvCache(k.data(), slot_stride, v.data(), slot_stride, slots, cache).ok());
      std::vector<float> q(static_cast<size_t>(q_len) * c.heads * c.d);
      for (float& x : q) x = dist(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      std::vector<float> want =
          DenseCausalAttention(q, k, v, len, q_len, c.heads, c.kv_heads, c.d, scale);
      q_all.insert(q_all.end(), q.begin(), q.end());
      want_all.insert(want_all.end(), want.begin(), want.end());
      seq_lens.push_back(len);
      query_start_loc.push_back(query_start_loc.back() + q_len);
    }

    std::vector<float> got(want_all.size(), -7.0f);
    PagedAttentionArgs args;
    args.q = q_all.data();
    args.q_token_stride = c.heads * c.d;
    args.num_heads = c.heads;
    args.cache = cache;
    args.query_start_loc = query_start_loc;
    args.seq_lens = seq_lens;
    args.block_tables = block_tables;
    args.block_table_stride = max_blocks;
    args.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    args.out = got.data();
    ASSERT_TRUE(reference::PagedAttention(args).ok());
    // Both sides accumulate in double; only the final fp32 roundings differ.
    EXPECT_THAT(got, Pointwise(FloatNear(1e-6f), want_all));
  }
}

}  // namespace
}  // namespace tessera::kernels::cpu
