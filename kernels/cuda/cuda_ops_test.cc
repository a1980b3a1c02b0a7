// Parity tests of the CUDA elementwise and logits kernels against the CPU
// reference kernels (kernels/cpu/reference_ops.h). Skipped without a CUDA
// device.
//
// Tolerances (bf16 outputs are compared with fp32 references computed from
// the same bf16-representable inputs):
//   embedding, gather_rows, kv_cache_write, argmax, fused-add residual: exact
//   rmsnorm, fused_add_rmsnorm, silu_mul: 2^-8 |ref| + 1e-5
//     (one bf16 rounding is <= 2^-9 |ref|; the rest covers fp32 vs double)
//   rope (with and without q/k norm): 2^-8 max|head| + 1e-5
//   softmax: 1e-5 |ref| + 1e-7; log_softmax: 1e-5 (1 + |ref|)
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gather_rows.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/silu_mul.h"
#include "kernels/cuda/top_one.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::FromBf16;
using cuda_testing::kBf16Eps;
using cuda_testing::RandomBf16Floats;
using cuda_testing::RandomFloats;
using cuda_testing::ToBf16;
using cuda_testing::Upload;
using cuda_testing::Zeros;
namespace ref = ::tessera::kernels::cpu::reference;

TEST(CudaDeviceBufferTest, RoundTripAndErrors) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  std::vector<float> v = RandomFloats(1001, 1);
  DeviceBuffer b = Upload(v);
  EXPECT_EQ(b.size(), v.size() * sizeof(float));
  EXPECT_EQ(Download<float>(b, v.size()), v);
  DeviceBuffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_NE(moved.data(), nullptr);
  absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Allocate(size_t{1} << 62);
  EXPECT_FALSE(huge.ok());
  EXPECT_FALSE(DeviceOrdinalForPciBusId("ffff:ff:ff.0").ok());
}

// Checked before any CUDA call, so this runs without a device too.
TEST(CudaDeviceBufferTest, CopyRowsBetweenDevicesRefusesBadArguments) {
  float a[8] = {}, b[8] = {};
  EXPECT_TRUE(CopyRowsBetweenDevices(a, 0, 16, b, 0, 16, 0, 2, nullptr).ok());  // nothing to copy
  EXPECT_EQ(CopyRowsBetweenDevices(nullptr, 0, 16, b, 0, 16, 16, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyRowsBetweenDevices(a, 0, 16, nullptr, 0, 16, 16, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyRowsBetweenDevices(a, 0, 8, b, 0, 16, 16, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // rows wider than the destination's pitch
  EXPECT_EQ(CopyRowsBetweenDevices(a, 0, 16, b, 0, 8, 16, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // and than the source's
}

TEST(CudaOpsTest, Embedding) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int64_t hidden : {8, 13, 64, 4096}) {
    const int64_t vocab = 37;
    std::vector<float> table = RandomBf16Floats(vocab * hidden, 2);
    std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 30};
    std::vector<float> want(ids.size() * hidden);
    cpu::WeightMatrix wm{nullptr, cpu::DType::kBF16, vocab, hidden};
    std::vector<Bf16> table_bf = ToBf16(table);
    wm.data = table_bf.data();
    ASSERT_TRUE(ref::Embedding(wm, ids, want.data()).ok());
    DeviceBuffer d_table = Upload(table_bf);
    // Out-of-range ids write zero rows.
    std::vector<int32_t> ids_bad = ids;
    ids_bad.push_back(-1);
    ids_bad.push_back(static_cast<int32_t>(vocab));
    DeviceBuffer d_ids = Upload(ids_bad);
    DeviceBuffer d_out = Zeros(ids_bad.size() * hidden * sizeof(float));
    ASSERT_TRUE(Embedding(d_table.as<Bf16>(), vocab, hidden, d_ids.as<int32_t>(),
                          static_cast<int64_t>(ids_bad.size()), d_out.as<float>(), nullptr)
                    .ok());
    std::vector<float> got = Download<float>(d_out, ids_bad.size() * hidden);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "hidden " << hidden;
    for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f);

    // The bf16 form: the table's bits, zero rows for the bad ids.
    DeviceBuffer d_bf = Upload(std::vector<Bf16>(ids_bad.size() * hidden, 0x7fc0));  // NaNs
    ASSERT_TRUE(EmbeddingBf16(d_table.as<Bf16>(), vocab, hidden, d_ids.as<int32_t>(),
                              static_cast<int64_t>(ids_bad.size()), d_bf.as<Bf16>(), nullptr)
                    .ok());
    std::vector<Bf16> got_bf = Download<Bf16>(d_bf, ids_bad.size() * hidden);
    for (size_t r = 0; r < ids_bad.size(); ++r) {
      const bool valid = ids_bad[r] >= 0 && ids_bad[r] < vocab;
      for (int64_t c = 0; c < hidden; ++c) {
        ASSERT_EQ(got_bf[r * hidden + c], valid ? table_bf[ids_bad[r] * hidden + c] : Bf16{0})
            << "hidden " << hidden << " row " << r;
      }
    }
  }
  EXPECT_FALSE(EmbeddingBf16(nullptr, 1, 1, nullptr, 1, nullptr, nullptr).ok());
  EXPECT_FALSE(Embedding(nullptr, 1, 1, nullptr, 1, nullptr, nullptr).ok());
  EXPECT_FALSE(Embedding(nullptr, 0, 1, nullptr, 0, nullptr, nullptr).ok());
}

void CheckRmsNorm(int64_t rows, int64_t cols, bool fused) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << " cols " << cols << " fused " << fused);
  const float eps = 1e-6f;
  std::vector<float> x = RandomFloats(rows * cols, 3 + rows, -4.f, 4.f);
  std::vector<float> delta = RandomBf16Floats(rows * cols, 4 + cols, -2.f, 2.f);
  std::vector<float> w = RandomFloats(cols, 5, 0.5f, 1.5f);
  DeviceBuffer d_x = Upload(x);
  DeviceBuffer d_w = Upload(w);
  DeviceBuffer d_delta = Upload(ToBf16(delta));
  DeviceBuffer d_out = Zeros(rows * cols * sizeof(Bf16));
  std::vector<float> want(rows * cols);
  std::vector<float> want_residual = x;
  if (fused) {
    std::vector<float> sum = delta;  // x += residual; residual = x
    ref::FusedAddRmsNorm(sum.data(), want_residual.data(), w.data(), rows, cols, eps);
    want = sum;
    // Odd row counts run in place (out == delta).
    const bool in_place = rows % 2 == 1;
    ASSERT_TRUE(FusedAddRmsNorm(d_delta.as<Bf16>(), d_x.as<float>(), rows, cols, d_w.as<float>(),
                                eps, in_place ? d_delta.as<Bf16>() : d_out.as<Bf16>(), nullptr)
                    .ok());
    if (in_place) d_out = std::move(d_delta);
    std::vector<float> got_residual = Download<float>(d_x, rows * cols);
    for (size_t i = 0; i < got_residual.size(); ++i) {
      ASSERT_EQ(got_residual[i], want_residual[i]) << i;
    }
  } else {
    ref::RmsNorm(x.data(), w.data(), rows, cols, eps, want.data());
    ASSERT_TRUE(
        RmsNorm(d_x.as<float>(), rows, cols, d_w.as<float>(), eps, d_out.as<Bf16>(), nullptr).ok());
  }
  std::vector<float> got = FromBf16(Download<Bf16>(d_out, rows * cols));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], kBf16Eps * std::fabs(want[i]) + 1e-5) << i;
  }
}

TEST(CudaOpsTest, RmsNormAndFusedAdd) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int64_t rows : {1, 2, 7, 33}) {
    for (int64_t cols : {1, 7, 64, 100, 4096, 5120 + 3}) {
      CheckRmsNorm(rows, cols, false);
      CheckRmsNorm(rows, cols, true);
    }
  }
  EXPECT_FALSE(RmsNorm(nullptr, 1, 0, nullptr, 1e-6f, nullptr, nullptr).ok());
  EXPECT_TRUE(RmsNorm(nullptr, 0, 8, nullptr, 1e-6f, nullptr, nullptr).ok());
}

// llama3 rope scaling of inv_freq (factor 8, low 1, high 4, original 8192).
std::vector<float> Llama3InvFreq(int head_dim, double theta) {
  std::vector<float> out(head_dim / 2);
  const double pi = 3.14159265358979323846;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double f = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    const double wavelen = 2 * pi / f;
    const double low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
    double g;
    if (wavelen < high_wavelen) {
      g = f;
    } else if (wavelen > low_wavelen) {
      g = f / 8.0;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      g = (1 - smooth) * f / 8.0 + smooth * f;
    }
    out[i] = static_cast<float>(g);
  }
  return out;
}

void CheckRope(int64_t tokens, int heads, int kv_heads, int head_dim, bool qk_norm) {
  SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " heads " << heads << " kv "
                                    << kv_heads << " head_dim " << head_dim << " norm " << qk_norm);
  // Fused qkv rows: [q heads | k heads | v heads].
  const int64_t stride = int64_t{heads + 2 * kv_heads} * head_dim;
  std::vector<float> qkv = RandomBf16Floats(tokens * stride, 7 + head_dim, -3.f, 3.f);
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>((t * 7919) % 131072);
  const std::vector<float> inv_freq = Llama3InvFreq(head_dim, 500000.0);
  std::vector<float> q_norm = RandomFloats(head_dim, 8, 0.5f, 1.5f);
  std::vector<float> k_norm = RandomFloats(head_dim, 9, 0.5f, 1.5f);
  const float eps = 1e-6f;

  std::vector<float> want = qkv;
  if (qk_norm) {
    for (int64_t t = 0; t < tokens; ++t) {
      float* q = want.data() + t * stride;
      float* k = q + int64_t{heads} * head_dim;
      ref::RmsNorm(q, q_norm.data(), heads, head_dim, eps, q);
      ref::RmsNorm(k, k_norm.data(), kv_heads, head_dim, eps, k);
    }
  }
  ref::Rope(positions, inv_freq, head_dim, want.data(), heads, stride,
            want.data() + int64_t{heads} * head_dim, kv_heads, stride);

  DeviceBuffer d_qkv = Upload(ToBf16(qkv));
  DeviceBuffer d_pos = Upload(positions);
  DeviceBuffer d_freq = Upload(inv_freq);
  DeviceBuffer d_qn = Upload(q_norm);
  DeviceBuffer d_kn = Upload(k_norm);
  Bf16* q = d_qkv.as<Bf16>();
  ASSERT_TRUE(Rope(q, stride, heads, q + int64_t{heads} * head_dim, stride, kv_heads, head_dim,
                   d_pos.as<int32_t>(), tokens, d_freq.as<float>(),
                   qk_norm ? d_qn.as<float>() : nullptr, qk_norm ? d_kn.as<float>() : nullptr, eps,
                   nullptr)
                  .ok());
  std::vector<float> got = FromBf16(Download<Bf16>(d_qkv, tokens * stride));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads + 2 * kv_heads; ++h) {
      const int64_t base = t * stride + int64_t{h} * head_dim;
      double max_abs = 0;
      for (int i = 0; i < head_dim; ++i)
        max_abs = std::max(max_abs, double{std::fabs(want[base + i])});
      for (int i = 0; i < head_dim; ++i) {
        if (h >= heads + kv_heads) {
          ASSERT_EQ(got[base + i], qkv[base + i]) << "v must be untouched";
        } else {
          ASSERT_NEAR(got[base + i], want[base + i], kBf16Eps * max_abs + 1e-5)
              << "token " << t << " head " << h << " i " << i;
        }
      }
    }
  }
}

TEST(CudaOpsTest, Rope) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int64_t tokens : {1, 5, 33}) {
    for (int head_dim : {64, 128, 80}) {
      CheckRope(tokens, 8, 2, head_dim, false);
      CheckRope(tokens, 12, 4, head_dim, true);
    }
  }
  CheckRope(3, 4, 4, 256, true);
  CheckRope(2, 2, 1, 512, false);
  EXPECT_FALSE(
      Rope(nullptr, 0, 1, nullptr, 0, 1, 7, nullptr, 1, nullptr, nullptr, nullptr, 0, nullptr)
          .ok());
}

TEST(CudaOpsTest, SiluMul) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int64_t rows : {1, 3, 33}) {
    for (int64_t inter : {1, 13, 64, 1000, 14336}) {
      SCOPED_TRACE(::testing::Message() << rows << "x" << inter);
      std::vector<float> gu = RandomBf16Floats(rows * 2 * inter, 11, -6.f, 6.f);
      std::vector<float> want(rows * inter);
      ref::SiluMul(gu.data(), rows, inter, want.data());
      DeviceBuffer d_gu = Upload(ToBf16(gu));
      DeviceBuffer d_out = Zeros(rows * inter * sizeof(Bf16));
      ASSERT_TRUE(SiluMul(d_gu.as<Bf16>(), rows, inter, d_out.as<Bf16>(), nullptr).ok());
      std::vector<float> got = FromBf16(Download<Bf16>(d_out, rows * inter));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], kBf16Eps * std::fabs(want[i]) + 1e-5) << i;
      }
      if (inter % 4 != 0) {
        EXPECT_EQ(SiluMul(d_gu.as<Bf16>(), rows, inter, d_out.as<Bf16>(), nullptr, true).code(),
                  absl::StatusCode::kInvalidArgument);
        continue;
      }
      // The same rows in the gate/up GEMV order give the same bits.
      std::vector<float> gu_ord(gu.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < 2 * inter; ++c)
          gu_ord[r * 2 * inter + GemvGateUpRow(c, inter)] = gu[r * 2 * inter + c];
      }
      DeviceBuffer d_ord = Upload(ToBf16(gu_ord));
      DeviceBuffer d_out_ord = Zeros(rows * inter * sizeof(Bf16));
      ASSERT_TRUE(SiluMul(d_ord.as<Bf16>(), rows, inter, d_out_ord.as<Bf16>(), nullptr, true).ok());
      EXPECT_EQ(Download<Bf16>(d_out_ord, rows * inter), Download<Bf16>(d_out, rows * inter));
    }
  }
}

TEST(CudaOpsTest, WriteKvCache) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int head_dim : {64, 128, 6}) {
    const int kv_heads = 3;
    const int64_t row = int64_t{kv_heads} * head_dim;
    const int64_t num_slots = 4 * 16;
    const int64_t stride = row * 3 + (head_dim == 6 ? 2 : 0);  // inside a qkv row
    const int64_t tokens = 9;
    std::vector<float> qkv = RandomBf16Floats(tokens * stride, 12);
    std::vector<int64_t> slots = {0, 17, -1, 63, 5, num_slots, 40, -7, 1};
    const Bf16 kSentinel = 0x7fc1;
    std::vector<Bf16> cache_init(num_slots * row, kSentinel);
    DeviceBuffer d_qkv = Upload(ToBf16(qkv));
    DeviceBuffer d_slots = Upload(slots);
    DeviceBuffer d_k = Upload(cache_init);
    DeviceBuffer d_v = Upload(cache_init);
    const Bf16* k = d_qkv.as<Bf16>() + row;
    const Bf16* v = d_qkv.as<Bf16>() + 2 * row;
    ASSERT_TRUE(WriteKvCache(k, stride, v, stride, tokens, kv_heads, head_dim,
                             d_slots.as<int64_t>(), d_k.as<Bf16>(), d_v.as<Bf16>(), num_slots,
                             nullptr)
                    .ok());
    std::vector<Bf16> want_k = cache_init, want_v = cache_init;
    const std::vector<Bf16> src = ToBf16(qkv);
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0 || slots[t] >= num_slots) continue;
      for (int64_t i = 0; i < row; ++i) {
        want_k[slots[t] * row + i] = src[t * stride + row + i];
        want_v[slots[t] * row + i] = src[t * stride + 2 * row + i];
      }
    }
    EXPECT_EQ(Download<Bf16>(d_k, want_k.size()), want_k) << head_dim;
    EXPECT_EQ(Download<Bf16>(d_v, want_v.size()), want_v) << head_dim;
  }
}

// Rope with the KV-cache write fused: q/k in place and the cache equal, bit
// for bit, to Rope followed by WriteKvCache.
TEST(CudaOpsTest, RopeWritesKvCache) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int head_dim : {64, 128}) {
    for (bool qk_norm : {false, true}) {
      const int heads = 8, kv_heads = 2;
      const int64_t row = int64_t{kv_heads} * head_dim;
      const int64_t stride = int64_t{heads} * head_dim + 2 * row;
      const int64_t tokens = 7, num_slots = 32;
      std::vector<float> qkv = RandomBf16Floats(tokens * stride, 21 + head_dim, -2.f, 2.f);
      std::vector<int32_t> positions = {0, 5, 17, 300, 4095, 9, 1};
      std::vector<int64_t> slots = {3, 0, -1, 31, 12, num_slots, 7};
      const std::vector<float> inv_freq = Llama3InvFreq(head_dim, 500000.0);
      std::vector<float> q_norm = RandomFloats(head_dim, 22, 0.5f, 1.5f);
      std::vector<float> k_norm = RandomFloats(head_dim, 23, 0.5f, 1.5f);
      const Bf16 kSentinel = 0x7fc1;
      std::vector<Bf16> cache_init(num_slots * row, kSentinel);
      DeviceBuffer d_pos = Upload(positions), d_slots = Upload(slots), d_freq = Upload(inv_freq);
      DeviceBuffer d_qn = Upload(q_norm), d_kn = Upload(k_norm);
      const float* qn = qk_norm ? d_qn.as<float>() : nullptr;
      const float* kn = qk_norm ? d_kn.as<float>() : nullptr;
      // Two kernels.
      DeviceBuffer a_qkv = Upload(ToBf16(qkv)), a_k = Upload(cache_init), a_v = Upload(cache_init);
      Bf16* aq = a_qkv.as<Bf16>();
      Bf16* ak = aq + int64_t{heads} * head_dim;
      ASSERT_TRUE(Rope(aq, stride, heads, ak, stride, kv_heads, head_dim, d_pos.as<int32_t>(),
                       tokens, d_freq.as<float>(), qn, kn, 1e-6f, nullptr)
                      .ok());
      ASSERT_TRUE(WriteKvCache(ak, stride, ak + row, stride, tokens, kv_heads, head_dim,
                               d_slots.as<int64_t>(), a_k.as<Bf16>(), a_v.as<Bf16>(), num_slots,
                               nullptr)
                      .ok());
      // One.
      DeviceBuffer b_qkv = Upload(ToBf16(qkv)), b_k = Upload(cache_init), b_v = Upload(cache_init);
      Bf16* bq = b_qkv.as<Bf16>();
      Bf16* bk = bq + int64_t{heads} * head_dim;
      RopeKvWrite kv;
      kv.v = bk + row;
      kv.v_token_stride = stride;
      kv.slots = d_slots.as<int64_t>();
      kv.k_cache = b_k.as<Bf16>();
      kv.v_cache = b_v.as<Bf16>();
      kv.num_slots = num_slots;
      ASSERT_TRUE(Rope(bq, stride, heads, bk, stride, kv_heads, head_dim, d_pos.as<int32_t>(),
                       tokens, d_freq.as<float>(), qn, kn, 1e-6f, nullptr, &kv)
                      .ok());
      EXPECT_EQ(Download<Bf16>(b_qkv, tokens * stride), Download<Bf16>(a_qkv, tokens * stride));
      EXPECT_EQ(Download<Bf16>(b_k, cache_init.size()), Download<Bf16>(a_k, cache_init.size()));
      EXPECT_EQ(Download<Bf16>(b_v, cache_init.size()), Download<Bf16>(a_v, cache_init.size()));
      kv.slots = nullptr;  // incomplete: refused
      EXPECT_FALSE(Rope(bq, stride, heads, bk, stride, kv_heads, head_dim, d_pos.as<int32_t>(),
                        tokens, d_freq.as<float>(), qn, kn, 1e-6f, nullptr, &kv)
                       .ok());
    }
  }
}

TEST(CudaOpsTest, GatherRows) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (int64_t cols : {8, 13, 4096}) {
    const int64_t x_rows = 10;
    std::vector<Bf16> x = ToBf16(RandomFloats(x_rows * cols, 13));
    std::vector<int32_t> rows = {9, 0, 3, 3, -1, 10};
    DeviceBuffer d_x = Upload(x);
    DeviceBuffer d_rows = Upload(rows);
    DeviceBuffer d_out = Zeros(rows.size() * cols * sizeof(Bf16));
    ASSERT_TRUE(GatherRows(d_x.as<Bf16>(), x_rows, cols, d_rows.as<int32_t>(),
                           static_cast<int64_t>(rows.size()), d_out.as<Bf16>(), nullptr)
                    .ok());
    std::vector<Bf16> got = Download<Bf16>(d_out, rows.size() * cols);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        const bool valid = rows[i] >= 0 && rows[i] < x_rows;
        ASSERT_EQ(got[i * cols + c], valid ? x[rows[i] * cols + c] : 0) << i << " " << c;
      }
    }
  }
}

TEST(CudaOpsTest, SoftmaxLogSoftmaxArgmax) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const float kInf = std::numeric_limits<float>::infinity();
  for (int64_t rows : {1, 4, 33}) {
    for (int64_t vocab : {1, 7, 1000, 4099, 128256, 151936}) {
      SCOPED_TRACE(::testing::Message() << rows << "x" << vocab);
      std::vector<float> x = RandomFloats(rows * vocab, 14 + vocab, -20.f, 20.f);
      for (int64_t r = 0; r < rows; ++r) {
        if (vocab > 3) {
          x[r * vocab + 1] = -kInf;
          // A tie for the maximum: the lower index must win.
          x[r * vocab + vocab - 1] = 30.f;
          x[r * vocab + vocab / 2] = 30.f;
        }
      }
      std::vector<float> want_sm(x.size()), want_lsm(x.size());
      std::vector<int32_t> want_am(rows);
      ref::Softmax(x.data(), rows, vocab, want_sm.data());
      ref::LogSoftmax(x.data(), rows, vocab, want_lsm.data());
      ref::Argmax(x.data(), rows, vocab, want_am.data());
      DeviceBuffer d_x = Upload(x);
      DeviceBuffer d_sm = Zeros(x.size() * 4), d_lsm = Zeros(x.size() * 4), d_am = Zeros(rows * 4);
      ASSERT_TRUE(Softmax(d_x.as<float>(), rows, vocab, d_sm.as<float>(), nullptr).ok());
      ASSERT_TRUE(LogSoftmax(d_x.as<float>(), rows, vocab, d_lsm.as<float>(), nullptr).ok());
      ASSERT_TRUE(ArgmaxRows(d_x.as<float>(), rows, vocab, d_am.as<int32_t>(), nullptr).ok());
      std::vector<float> sm = Download<float>(d_sm, x.size());
      std::vector<float> lsm = Download<float>(d_lsm, x.size());
      EXPECT_EQ(Download<int32_t>(d_am, rows), want_am);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(sm[i], want_sm[i], 1e-5 * std::fabs(want_sm[i]) + 1e-7) << i;
        if (std::isinf(want_lsm[i])) {
          ASSERT_EQ(lsm[i], want_lsm[i]) << i;
        } else {
          ASSERT_NEAR(lsm[i], want_lsm[i], 1e-5 * (1 + std::fabs(want_lsm[i]))) << i;
        }
      }
    }
  }
}

}  // namespace
// TopOneRows against a host scan: the largest value, the lowest index among
// ties (-0.0 ties with +0.0), NaN skipped, an all-NaN row giving id -1; rows
// split over many CTAs, unaligned rows (vocab % 4 != 0, offset pointer), an
// index offset, and a workspace too small refused.
TEST(CudaOpsTest, TopOneRowsMatchesAHostScan) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t rows : {1, 3, 64, 300}) {
    for (int64_t vocab : {1, 7, 4099, 64128, 128256}) {
      for (int64_t shift : {0, 1}) {  // 1: rows start 4 bytes past 16-byte alignment
        SCOPED_TRACE(::testing::Message() << rows << "x" << vocab << " shift " << shift);
        std::vector<float> x = RandomFloats(rows * vocab + shift, 3 + vocab + rows, -20.f, 20.f);
        float* v = x.data() + shift;
        for (int64_t r = 0; r < rows; ++r) {
          float* row = v + r * vocab;
          if (r % 5 == 1) {
            for (int64_t i = 0; i < vocab; ++i) row[i] = kNan;
            continue;
          }
          if (r % 5 == 2 && vocab > 3) {  // a tie across CTAs: the lower index wins
            row[vocab - 2] = 40.f;
            row[vocab / 3] = 40.f;
            row[0] = kNan;
          }
          if (r % 5 == 3) {  // all zero but signs: -0.0 at the end ties with +0.0
            for (int64_t i = 0; i < vocab; ++i) row[i] = -1.f;
            row[vocab - 1] = -0.f;
            row[vocab / 2] = 0.f;
          }
        }
        const int64_t offset = 1000;
        std::vector<int32_t> want_ids(rows);
        std::vector<float> want_values(rows);
        for (int64_t r = 0; r < rows; ++r) {
          int64_t best = -1;
          for (int64_t i = 0; i < vocab; ++i) {
            const float y = v[r * vocab + i];
            if (std::isnan(y)) continue;
            if (best < 0 || y > v[r * vocab + best]) best = i;
          }
          want_ids[r] = best < 0 ? -1 : static_cast<int32_t>(best + offset);
          want_values[r] = best < 0 ? -std::numeric_limits<float>::max() : v[r * vocab + best];
        }
        DeviceBuffer d_x = Upload(x), d_ids = Zeros(rows * 4), d_values = Zeros(rows * 4);
        const size_t ws_bytes = TopOneWorkspaceBytes(rows);
        DeviceBuffer ws = Zeros(ws_bytes);
        const float* logits = d_x.as<float>() + shift;
        ASSERT_TRUE(TopOneRows(logits, rows, vocab, offset, d_ids.as<int32_t>(),
                               d_values.as<float>(), ws.data(), ws_bytes, nullptr)
                        .ok());
        EXPECT_EQ(Download<int32_t>(d_ids, rows), want_ids);
        const std::vector<float> values = Download<float>(d_values, rows);
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(values[r], want_values[r]) << r;
        EXPECT_EQ(TopOneRows(logits, rows, vocab, offset, d_ids.as<int32_t>(), d_values.as<float>(),
                             ws.data(), ws_bytes - 8, nullptr)
                      .code(),
                  absl::StatusCode::kInvalidArgument);
      }
    }
  }
}

// What TopOneRows refuses is refused on the host, before anything runs (no
// device needed): bad sizes, null pointers, ids beyond int32, too many rows
// for the grid, a missing or short workspace.
TEST(CudaOpsTest, TopOneRowsRefusesBadArgumentsOnTheHost) {
  float logits[4] = {};
  int32_t ids[1] = {};
  float values[1] = {};
  uint64_t ws[512] = {};
  const size_t ws_bytes = sizeof(ws);
  auto call = [&](int64_t rows, int64_t vocab, int64_t offset, const float* x, void* w,
                  size_t w_bytes) {
    return TopOneRows(x, rows, vocab, offset, ids, values, w, w_bytes, nullptr).code();
  };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(call(-1, 4, 0, logits, ws, ws_bytes), kBad);
  EXPECT_EQ(call(1, 0, 0, logits, ws, ws_bytes), kBad);
  EXPECT_EQ(call(1, 4, 0, nullptr, ws, ws_bytes), kBad);
  EXPECT_EQ(call(1, int64_t{1} << 31, 0, logits, ws, ws_bytes), kBad);
  EXPECT_EQ(call(1, 4, (int64_t{1} << 31) - 2, logits, ws, ws_bytes), kBad);
  EXPECT_EQ(call(65536, 4, 0, logits, ws, ws_bytes), kBad);
  EXPECT_EQ(call(1, 4, 0, logits, nullptr, ws_bytes), kBad);
  EXPECT_EQ(call(1, 4, 0, logits, ws, TopOneWorkspaceBytes(1) - 1), kBad);
  EXPECT_GE(ws_bytes, TopOneWorkspaceBytes(1));
  EXPECT_EQ(TopOneRows(logits, 0, 4, 0, nullptr, nullptr, nullptr, 0, nullptr).code(),
            absl::StatusCode::kOk);  // no rows: nothing to do
}

}  // namespace tessera::kernels::cuda
