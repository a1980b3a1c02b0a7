// Parity tests: every optimized CPU op (cpu_ops.h) against the reference
// (reference_ops.h) on random inputs, for every ISA level this CPU supports
// and with and without a thread pool.
//
// Tolerances (the reference accumulates in double, the optimized kernels in
// fp32 with a different summation order and a polynomial exp):
//   Embedding, WriteKvCache, Argmax, ReduceSum   exact
//   FusedAddRmsNorm residual output              exact (one fp32 add each)
//   RmsNorm, FusedAddRmsNorm                     |d| <= 1e-5 |ref| + 1e-6
//   Rope                                         |d| <= 1e-5 max|x| + 1e-6
//   Gemm                                         |d| <= 1e-5 sum_k |x w| + 1e-6
//   SiluMul                                      |d| <= 1e-5 |ref| + 1e-6
//   PagedAttention                               |d| <= 2e-5 max|v|
//   Softmax                                      |d| <= 1e-5 |ref| + 1e-7
//   LogSoftmax                                   |d| <= 1e-5 (1 + |ref|)
#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"

namespace tessera::kernels::cpu {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Config {
  CpuIsa isa;
  int threads;  // 0: no pool
};

std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  return absl::StrCat(std::string(CpuIsaName(info.param.isa)), "_threads", info.param.threads);
}

// Every ISA level; those this host cannot run skip (reported as skipped,
// not left out).
std::vector<Config> AllConfigs() {
  std::vector<Config> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    out.push_back({isa, 0});
    out.push_back({isa, 3});
  }
  return out;
}

std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight matrix with storage for any dtype, filled with random values.
struct TestWeights {
  std::vector<float> f32;
  std::vector<fp16_t> f16;
  std::vector<bf16_t> bf16;
  WeightMatrix view;
};

std::unique_ptr<TestWeights> RandomWeights(std::mt19937& rng, DType dtype, int64_t rows,
                                           int64_t cols, float scale = 1.0f) {
  auto w = std::make_unique<TestWeights>();
  std::vector<float> values = RandomFloats(rng, rows * cols, -scale, scale);
  w->view = {nullptr, dtype, rows, cols};
  switch (dtype) {
    case DType::kF32:
      w->f32 = values;
      w->view.data = w->f32.data();
      break;
    case DType::kF16:
      for (float v : values) w->f16.push_back(F32ToF16(v));
      w->view.data = w->f16.data();
      break;
    case DType::kBF16:
      for (float v : values) w->bf16.push_back(F32ToBf16(v));
      w->view.data = w->bf16.data();
      break;
  }
  return w;
}

// Checks |got[i] - want[i]| <= tol(i) for every i; reports the first few misses.
template <typename Tol>
void ExpectClose(const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want, Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (same_inf) continue;
    const float diff = std::fabs(got[i] - want[i]);
    if (!(diff <= tol(i))) {
      if (++misses <= 5) {
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i] << " diff "
                      << diff << " tol " << tol(i);
      }
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

void ExpectRelClose(const std::string& what, const std::vector<float>& got,
                    const std::vector<float>& want, float rel, float abs) {
  ExpectClose(what, got, want, [&](size_t i) { return rel * std::fabs(want[i]) + abs; });
}

class CpuOpsTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (auto why = WhyNotCpuIsa(GetParam().isa, HostCpuFeatures())) GTEST_SKIP() << *why;
    if (GetParam().threads > 0) pool_ = std::make_unique<ThreadPool>(GetParam().threads);
    ctx_ = CpuContext{pool_.get(), GetParam().isa};
  }

  std::unique_ptr<ThreadPool> pool_;
  CpuContext ctx_;
  std::mt19937 rng_{1234};
};

TEST_P(CpuOpsTest, EmbeddingIsExactForEveryDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t hidden : {1, 7, 16, 33, 4101}) {
      auto table = RandomWeights(rng_, dtype, 37, hidden);
      std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 30, 2, 9};
      std::vector<float> got(ids.size() * hidden, -7.0f), want(ids.size() * hidden);
      ASSERT_TRUE(Embedding(ctx_, table->view, ids, got.data()).ok());
      ASSERT_TRUE(reference::Embedding(table->view, ids, want.data()).ok());
      EXPECT_EQ(got, want) << DTypeName(dtype) << " hidden=" << hidden;
    }
  }
}

TEST_P(CpuOpsTest, EmbeddingRejectsOutOfRangeIdsWithoutWriting) {
  auto table = RandomWeights(rng_, DType::kBF16, 10, 8);
  for (int32_t bad : {-1, 10, 1 << 30}) {
    std::vector<int32_t> ids = {1, bad, 2};
    std::vector<float> out(ids.size() * 8, -7.0f);
    absl::Status s = Embedding(ctx_, table->view, ids, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("token id ", bad)));
    EXPECT_THAT(out, ::testing::Each(-7.0f));
  }
}

TEST_P(CpuOpsTest, RmsNormMatchesReference) {
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {1, 5, 16, 31, 128, 4099}) {
      std::vector<float> x = RandomFloats(rng_, rows * dim, -3.0f, 3.0f);
      std::vector<float> w = RandomFloats(rng_, dim, 0.5f, 1.5f);
      std::vector<float> got(x.size()), want(x.size());
      RmsNorm(ctx_, x.data(), w.data(), rows, dim, 1e-6f, got.data());
      reference::RmsNorm(x.data(), w.data(), rows, dim, 1e-6f, want.data());
      const std::string what = absl::StrCat("rows=", rows, " dim=", dim);
      ExpectRelClose(what, got, want, 1e-5f, 1e-6f);
      // In place.
      std::vector<float> inplace = x;
      RmsNorm(ctx_, inplace.data(), w.data(), rows, dim, 1e-6f, inplace.data());
      EXPECT_EQ(inplace, got) << what;
    }
  }
}

TEST_P(CpuOpsTest, FusedAddRmsNormMatchesReference) {
  for (int64_t rows : {1, 4, 9}) {
    for (int64_t dim : {3, 16, 100, 2048}) {
      std::vector<float> x = RandomFloats(rng_, rows * dim, -2.0f, 2.0f);
      std::vector<float> residual = RandomFloats(rng_, rows * dim, -2.0f, 2.0f);
      std::vector<float> w = RandomFloats(rng_, dim, 0.5f, 1.5f);
      std::vector<float> got_x = x, got_r = residual, want_x = x, want_r = residual;
      FusedAddRmsNorm(ctx_, got_x.data(), got_r.data(), w.data(), rows, dim, 1e-5f);
      reference::FusedAddRmsNorm(want_x.data(), want_r.data(), w.data(), rows, dim, 1e-5f);
      const std::string what = absl::StrCat("rows=", rows, " dim=", dim);
      EXPECT_EQ(got_r, want_r) << what;
      ExpectRelClose(what, got_x, want_x, 1e-5f, 1e-6f);
    }
  }
}

TEST_P(CpuOpsTest, RopeMatchesReferenceInsideAFusedQkvBuffer) {
  struct Shape {
    int head_dim, heads, kv_heads;
  };
  for (Shape sh : {Shape{2, 1, 1}, Shape{6, 3, 1}, Shape{64, 4, 2}, Shape{80, 5, 5},
                   Shape{128, 8, 2}, Shape{256, 2, 1}, Shape{516, 1, 1}}) {
    const int64_t tokens = 11;
    // One fused row per token: [q heads | k heads | v heads].
    const int64_t stride = int64_t{sh.heads + 2 * sh.kv_heads} * sh.head_dim;
    std::vector<float> qkv = RandomFloats(rng_, tokens * stride);
    std::vector<float> inv_freq(sh.head_dim / 2);
    for (int i = 0; i < sh.head_dim / 2; ++i) {
      inv_freq[i] = std::pow(500000.0f, -2.0f * i / sh.head_dim);
    }
    std::vector<int32_t> positions(tokens);
    std::uniform_int_distribution<int32_t> pos(0, 131071);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = 0;

    std::vector<float> got = qkv, want = qkv;
    const int64_t k_offset = int64_t{sh.heads} * sh.head_dim;
    Rope(ctx_, positions, inv_freq, sh.head_dim, got.data(), sh.heads, stride,
         got.data() + k_offset, sh.kv_heads, stride);
    reference::Rope(positions, inv_freq, sh.head_dim, want.data(), sh.heads, stride,
                    want.data() + k_offset, sh.kv_heads, stride);
    ExpectClose(absl::StrCat("head_dim=", sh.head_dim), got, want,
                [](size_t) { return 1e-5f * 1.0f + 1e-6f; });
    // The V part is untouched.
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = k_offset + int64_t{sh.kv_heads} * sh.head_dim; i < stride; ++i) {
        ASSERT_EQ(got[t * stride + i], qkv[t * stride + i]);
      }
    }
    // Without k, only q rotates.
    std::vector<float> q_only = qkv;
    Rope(ctx_, positions, inv_freq, sh.head_dim, q_only.data(), sh.heads, stride, nullptr, 0, 0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < stride; ++i) {
        ASSERT_EQ(q_only[t * stride + i], i < k_offset ? got[t * stride + i] : qkv[t * stride + i]);
      }
    }
  }
}

TEST_P(CpuOpsTest, GemmMatchesReferenceAcrossShapesAndDtypes) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t m : {1, 2, 3, 5, 8, 13}) {
      for (int64_t n : {1, 7, 24, 37}) {
        for (int64_t k : {1, 15, 16, 33, 257, 1000}) {
          for (bool with_bias : {false, true}) {
            auto w = RandomWeights(rng_, dtype, n, k);
            std::vector<float> x = RandomFloats(rng_, m * k);
            std::vector<float> bias = RandomFloats(rng_, n);
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> got(m * n, -7.0f), want(m * n);
            Gemm(ctx_, x.data(), m, w->view, b, got.data());
            reference::Gemm(x.data(), m, w->view, b, want.data());
            // Error bound scales with sum_k |x w|.
            std::vector<float> abs_x(x.size());
            std::transform(x.begin(), x.end(), abs_x.begin(), [](float v) { return std::fabs(v); });
            std::vector<float> abs_w(n * k), widened(n * k);
            std::vector<int32_t> all_rows(n);
            std::iota(all_rows.begin(), all_rows.end(), 0);
            ASSERT_TRUE(reference::Embedding(w->view, all_rows, widened.data()).ok());
            for (int64_t i = 0; i < n * k; ++i) abs_w[i] = std::fabs(widened[i]);
            std::vector<float> magnitude(m * n);
            reference::Gemm(abs_x.data(), m, WeightMatrix{abs_w.data(), DType::kF32, n, k}, nullptr,
                            magnitude.data());
            ExpectClose(absl::StrCat(std::string(DTypeName(dtype)), " m=", m, " n=", n, " k=", k,
                                     " bias=", with_bias),
                        got, want, [&](size_t i) { return 1e-5f * magnitude[i] + 1e-6f; });
          }
        }
      }
    }
  }
}

TEST_P(CpuOpsTest, GemmMatchesReferenceAtModelSizes) {
  struct Shape {
    int64_t m, n, k;
    DType dtype;
  };
  for (Shape sh : {Shape{1, 4104, 2048, DType::kBF16}, Shape{1, 1000, 4096, DType::kF16},
                   Shape{64, 260, 1024, DType::kBF16}, Shape{17, 96, 3000, DType::kF32}}) {
    auto w = RandomWeights(rng_, sh.dtype, sh.n, sh.k, 0.05f);
    std::vector<float> x = RandomFloats(rng_, sh.m * sh.k);
    std::vector<float> got(sh.m * sh.n), want(sh.m * sh.n);
    Gemm(ctx_, x.data(), sh.m, w->view, nullptr, got.data());
    reference::Gemm(x.data(), sh.m, w->view, nullptr, want.data());
    // sum_k |x w| <= k * max|x| * max|w| = k * 0.05.
    const float bound = 1e-5f * 0.05f * sh.k + 1e-6f;
    ExpectClose(absl::StrCat("m=", sh.m, " n=", sh.n, " k=", sh.k), got, want,
                [&](size_t) { return bound; });
  }
}

TEST_P(CpuOpsTest, SiluMulMatchesReference) {
  for (int64_t rows : {1, 3}) {
    for (int64_t inter : {1, 7, 16, 100, 1000, 5000}) {
      std::vector<float> gate_up = RandomFloats(rng_, rows * 2 * inter, -20.0f, 20.0f);
      gate_up[0] = 0.0f;
      if (inter > 3) {
        gate_up[1] = -100.0f;
        gate_up[2] = 100.0f;
        gate_up[3] = -87.5f;
      }
      std::vector<float> got(rows * inter), want(rows * inter);
      SiluMul(ctx_, gate_up.data(), rows, inter, got.data());
      reference::SiluMul(gate_up.data(), rows, inter, want.data());
      ExpectRelClose(absl::StrCat("rows=", rows, " inter=", inter), got, want, 1e-5f, 1e-6f);
    }
  }
}

// A random paged KV cache and a batch of sequences over it.
struct AttentionCase {
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<std::pair<int, int>> seqs;  // (context already cached, new query tokens)
};

struct AttentionFixture {
  std::vector<float> k_cache, v_cache, q;
  std::vector<int32_t> query_start_loc, seq_lens, block_tables;
  PagedAttentionArgs args;
  float max_abs_v = 0.0f;
};

std::unique_ptr<AttentionFixture> MakeAttention(std::mt19937& rng, const AttentionCase& c,
                                                float scale) {
  auto f = std::make_unique<AttentionFixture>();
  int64_t max_blocks = 1;
  int64_t total_blocks = 0;
  for (auto [ctx, q_len] : c.seqs) {
    const int64_t blocks = (ctx + q_len + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  const int64_t num_blocks = total_blocks + 3;  // a few unused blocks
  // Physical blocks handed out in a random order.
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  size_t next = 0;
  f->query_start_loc.push_back(0);
  f->block_tables.assign(c.seqs.size() * (max_blocks + 1), -1);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    auto [ctx, q_len] = c.seqs[s];
    f->seq_lens.push_back(ctx + q_len);
    f->query_start_loc.push_back(f->query_start_loc.back() + q_len);
    const int64_t blocks = (ctx + q_len + c.block_size - 1) / c.block_size;
    for (int64_t b = 0; b < blocks; ++b)
      f->block_tables[s * (max_blocks + 1) + b] = physical[next++];
  }
  const int64_t slot_stride = int64_t{c.num_kv_heads} * c.head_dim;
  f->k_cache = RandomFloats(rng, num_blocks * c.block_size * slot_stride);
  f->v_cache = RandomFloats(rng, num_blocks * c.block_size * slot_stride, -2.0f, 2.0f);
  for (float v : f->v_cache) f->max_abs_v = std::max(f->max_abs_v, std::fabs(v));
  const int64_t q_stride = int64_t{c.num_heads} * c.head_dim + 5;  // padded rows
  f->q = RandomFloats(rng, f->query_start_loc.back() * q_stride);

  PagedAttentionArgs& a = f->args;
  a.q = f->q.data();
  a.q_token_stride = q_stride;
  a.num_heads = c.num_heads;
  a.cache = PagedKvCache{f->k_cache.data(), f->v_cache.data(), num_blocks,
                         c.block_size,      c.num_kv_heads,    c.head_dim};
  a.query_start_loc = f->query_start_loc;
  a.seq_lens = f->seq_lens;
  a.block_tables = f->block_tables;
  a.block_table_stride = max_blocks + 1;
  a.scale = scale;
  return f;
}

TEST_P(CpuOpsTest, PagedAttentionMatchesReference) {
  const std::vector<std::pair<int, int>> mixed = {
      {0, 5},    // fresh prefill, partial block
      {37, 1},   // decode
      {20, 13},  // prefill chunk with earlier context
      {0, 1},    // single-token prompt
      {16, 16},  // block-aligned
      {100, 1},  // longer decode
      {3, 40},   // chunk spanning many blocks
  };
  std::vector<AttentionCase> cases = {
      {1, 1, 8, 1, mixed},         {4, 4, 64, 4, mixed},
      {8, 2, 128, 16, mixed},      {12, 4, 80, 16, mixed},
      {7, 1, 96, 32, mixed},       {4, 1, 256, 16, mixed},
      {32, 8, 128, 16, {{0, 70}}}, {16, 2, 64, 8, {{500, 1}, {200, 1}, {0, 1}}},
      {2, 1, 20, 5, {{7, 9}}},
  };
  for (const AttentionCase& c : cases) {
    for (float scale : {1.0f / std::sqrt(static_cast<float>(c.head_dim)), 1.0f}) {
      auto f = MakeAttention(rng_, c, scale);
      const int64_t out_size = f->args.num_tokens() * c.num_heads * c.head_dim;
      std::vector<float> got(out_size, -7.0f), want(out_size, -9.0f);
      PagedAttentionArgs a = f->args;
      a.out = got.data();
      ASSERT_TRUE(PagedAttention(ctx_, a).ok());
      a.out = want.data();
      ASSERT_TRUE(reference::PagedAttention(a).ok());
      const float tol = 2e-5f * f->max_abs_v;
      ExpectClose(absl::StrCat("heads=", c.num_heads, "/", c.num_kv_heads, " d=", c.head_dim,
                               " bs=", c.block_size, " scale=", scale),
                  got, want, [&](size_t) { return tol; });
    }
  }
}

TEST_P(CpuOpsTest, PagedAttentionRejectsBadBatchesWithoutWriting) {
  auto f = MakeAttention(rng_, {4, 2, 16, 4, {{5, 3}, {0, 2}}}, 0.25f);
  std::vector<float> out(f->args.num_tokens() * 4 * 16, -7.0f);
  PagedAttentionArgs a = f->args;
  a.out = out.data();
  a.num_heads = 3;  // not a multiple of num_kv_heads
  EXPECT_EQ(PagedAttention(ctx_, a).code(), absl::StatusCode::kInvalidArgument);
  a = f->args;
  a.out = out.data();
  std::vector<int32_t> tables = f->block_tables;
  tables[0] = static_cast<int32_t>(a.cache.num_blocks);  // outside the cache
  a.block_tables = tables;
  absl::Status s = PagedAttention(ctx_, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("block 0"));
  a = f->args;
  a.out = out.data();
  std::vector<int32_t> lens = f->seq_lens;
  lens[1] = 1;  // fewer tokens than queries
  a.seq_lens = lens;
  EXPECT_EQ(PagedAttention(ctx_, a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out, ::testing::Each(-7.0f));
}

TEST_P(CpuOpsTest, WriteKvCacheMatchesReferenceAndSkipsPadding) {
  const PagedKvCache shape{nullptr, nullptr, 6, 4, 2, 24};
  const int64_t cache_size = shape.num_slots() * shape.slot_stride();
  const int64_t tokens = 9;
  const int64_t stride = 3 * shape.slot_stride();  // k and v inside a fused qkv row
  std::vector<float> qkv = RandomFloats(rng_, tokens * stride);
  std::vector<int64_t> slots = {3, 4, -1, 23, 0, 9, -1, 10, 11};
  std::vector<float> got_k(cache_size, 0.5f), got_v(cache_size, 0.5f);
  std::vector<float> want_k = got_k, want_v = got_v;
  PagedKvCache got = shape, want = shape;
  got.k = got_k.data();
  got.v = got_v.data();
  want.k = want_k.data();
  want.v = want_v.data();
  const float* k = qkv.data() + shape.slot_stride();
  const float* v = qkv.data() + 2 * shape.slot_stride();
  ASSERT_TRUE(WriteKvCache(ctx_, k, stride, v, stride, slots, got).ok());
  ASSERT_TRUE(reference::WriteKvCache(k, stride, v, stride, slots, want).ok());
  EXPECT_EQ(got_k, want_k);
  EXPECT_EQ(got_v, want_v);
  // Slot 3 holds token 0's K row.
  for (int64_t i = 0; i < shape.slot_stride(); ++i) {
    ASSERT_EQ(got_k[3 * shape.slot_stride() + i], k[i]);
  }

  std::vector<int64_t> bad = {1, shape.num_slots()};
  std::vector<float> before = got_k;
  absl::Status s = WriteKvCache(ctx_, k, stride, v, stride, bad, got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("slot_mapping[1]"));
  EXPECT_EQ(got_k, before);
}

TEST_P(CpuOpsTest, SoftmaxAndLogSoftmaxMatchReference) {
  for (int64_t rows : {1, 3}) {
    for (int64_t cols : {1, 7, 17, 1000, 151936}) {
      std::vector<float> x = RandomFloats(rng_, rows * cols, -30.0f, 30.0f);
      for (int64_t r = 0; r < rows; ++r) {
        if (cols > 2) x[r * cols + 1] = -kInf;  // masked token
      }
      std::vector<float> got(x.size()), want(x.size());
      const std::string what = absl::StrCat("rows=", rows, " cols=", cols);
      Softmax(ctx_, x.data(), rows, cols, got.data());
      reference::Softmax(x.data(), rows, cols, want.data());
      ExpectRelClose("softmax " + what, got, want, 1e-5f, 1e-7f);
      if (cols > 2) {
        EXPECT_EQ(got[1], 0.0f);
      }
      LogSoftmax(ctx_, x.data(), rows, cols, got.data());
      reference::LogSoftmax(x.data(), rows, cols, want.data());
      ExpectRelClose("log_softmax " + what, got, want, 1e-5f, 1e-5f);
      // In place.
      std::vector<float> inplace = x;
      Softmax(ctx_, inplace.data(), rows, cols, inplace.data());
      Softmax(ctx_, x.data(), rows, cols, got.data());
      EXPECT_EQ(inplace, got) << what;
    }
  }
}

TEST_P(CpuOpsTest, ArgmaxMatchesReferenceIncludingTies) {
  for (int64_t cols : {1, 2, 15, 16, 17, 40, 1000, 151936}) {
    const int64_t rows = 4;
    std::vector<float> x = RandomFloats(rng_, rows * cols, -5.0f, 5.0f);
    // Row 1: a tie between two late positions; row 2: all equal; row 3: max in the tail.
    if (cols >= 3) {
      x[1 * cols + cols - 1] = 9.0f;
      x[1 * cols + cols - 3] = 9.0f;
    }
    std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, -kInf);
    x[3 * cols + cols - 1] = 100.0f;
    std::vector<int32_t> got(rows, -1), want(rows, -2);
    Argmax(ctx_, x.data(), rows, cols, got.data());
    reference::Argmax(x.data(), rows, cols, want.data());
    EXPECT_EQ(got, want) << "cols=" << cols;
    EXPECT_EQ(got[2], 0);
    EXPECT_EQ(got[3], cols - 1);
    if (cols >= 3) {
      EXPECT_EQ(got[1], cols - 3);
    }
  }
}

TEST_P(CpuOpsTest, ReduceSumIsBitwiseEqualToReference) {
  for (int num_inputs : {1, 2, 4}) {
    for (int64_t n : {1, 15, 1000, 40000}) {
      std::vector<std::vector<float>> buffers;
      std::vector<const float*> inputs;
      for (int r = 0; r < num_inputs; ++r) buffers.push_back(RandomFloats(rng_, n));
      for (const auto& b : buffers) inputs.push_back(b.data());
      std::vector<float> got(n), want(n);
      ReduceSum(ctx_, inputs, n, got.data());
      reference::ReduceSum(inputs, n, want.data());
      EXPECT_EQ(got, want) << "inputs=" << num_inputs << " n=" << n;
      // In place into the first buffer (how the all-reduce uses it).
      ReduceSum(ctx_, inputs, n, buffers[0].data());
      EXPECT_EQ(buffers[0], want);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CpuOpsTest, ::testing::ValuesIn(AllConfigs()), ConfigName);

TEST(CpuContextTest, DefaultContextUsesTheBestIsaAndTheDefaultPool) {
  CpuContext ctx = DefaultCpuContext();
  EXPECT_EQ(ctx.isa, BestCpuIsa(HostCpuFeatures()));
  EXPECT_EQ(ctx.pool, DefaultThreadPool());
}

}  // namespace
}  // namespace tessera::kernels::cpu
