// GPU sampling against the CPU sampler (worker/sampling/sampler.h): for the
// same logits, params, seed and position the GPU must pick exactly the CPU
// token, greedy rows must equal the reference argmax, and invalid rows give
// -1 (skipped without a CUDA device); bad arguments are refused on the host.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/occupy.h"
#include "kernels/cuda/sampling.h"
#include "worker/sampling/sampler.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::Upload;
using cuda_testing::Zeros;

struct Batch {
  int64_t vocab = 0;
  std::vector<float> logits;
  std::vector<RowSamplingParams> params;
};

// Logits of several flavours: smooth random, quantized (many exact ties),
// peaked, and with masked (-inf) entries.
Batch MakeBatch(int64_t rows, int64_t vocab, uint32_t seed) {
  Batch b;
  b.vocab = vocab;
  b.logits.resize(rows * vocab);
  b.params.resize(rows);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  const float temps[] = {0.f, 0.3f, 0.7f, 1.0f, 1.5f};
  const int32_t top_ks[] = {0, 1, 5, 50, -1, 1000};
  const float top_ps[] = {1.f, 0.9f, 0.5f, 0.95f, 0.1f};
  const float min_ps[] = {0.f, 0.f, 0.05f, 0.2f};
  for (int64_t r = 0; r < rows; ++r) {
    float* x = b.logits.data() + r * vocab;
    const int flavour = static_cast<int>(r % 4);
    for (int64_t i = 0; i < vocab; ++i) {
      float v = normal(rng);
      if (flavour == 1) v = std::round(v * 2.f) / 2.f;  // ties
      if (flavour == 2 && i % 97 == 3) v += 12.f;       // peaked
      if (flavour == 3 && uni(rng) < 0.3f) v = -std::numeric_limits<float>::infinity();
      x[i] = v;
    }
    if (flavour == 3) x[r % vocab] = normal(rng);  // at least one finite logit
    RowSamplingParams& p = b.params[r];
    p.temperature = temps[rng() % 5];
    p.top_k = top_ks[rng() % 6];
    p.top_p = top_ps[rng() % 5];
    p.min_p = min_ps[rng() % 4];
    p.seed = rng();
    p.position = static_cast<int64_t>(rng() % 100000);
  }
  return b;
}

std::vector<int32_t> RunGpu(const Batch& b) {
  const int64_t rows = static_cast<int64_t>(b.params.size());
  DeviceBuffer d_logits = Upload(b.logits);
  DeviceBuffer d_params = Upload(b.params);
  DeviceBuffer d_out = Zeros(rows * sizeof(int32_t));
  const size_t ws_bytes = SampleRowsWorkspaceBytes(rows, b.vocab);
  // NaN-filled: a weight the kernels did not write would show.
  DeviceBuffer d_ws = Upload(std::vector<uint8_t>(ws_bytes, 0xff));
  const absl::Status s =
      SampleRows(d_logits.as<float>(), rows, b.vocab, d_params.as<RowSamplingParams>(),
                 d_out.as<int32_t>(), d_ws.data(), ws_bytes, nullptr);
  EXPECT_TRUE(s.ok()) << s;
  return Download<int32_t>(d_out, rows);
}

sampling::SamplingParams CpuParams(const RowSamplingParams& p) {
  sampling::SamplingParams c;
  c.temperature = p.temperature;
  c.top_k = p.top_k;
  c.top_p = p.top_p;
  c.min_p = p.min_p;
  c.seed = p.seed;
  return c;
}

void CheckAgainstCpu(int64_t rows, int64_t vocab, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab);
  const Batch b = MakeBatch(rows, vocab, seed);
  const std::vector<int32_t> got = RunGpu(b);
  const sampling::TokenCounts no_counts;
  int mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowSamplingParams& p = b.params[r];
    absl::Span<const float> row(b.logits.data() + r * vocab, vocab);
    absl::StatusOr<sampling::SampleResult> want =
        sampling::Sample(row, CpuParams(p), no_counts, p.position);
    ASSERT_TRUE(want.ok()) << want.status();
    if (p.temperature == 0.f) {
      int32_t am = -1;
      cpu::reference::Argmax(row.data(), 1, vocab, &am);
      EXPECT_EQ(got[r], am) << "greedy row " << r;
    }
    if (got[r] != want->token) {
      ++mismatches;
      ADD_FAILURE() << "row " << r << ": gpu " << got[r] << " cpu " << want->token
                    << " (T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
                    << " min_p=" << p.min_p << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaSamplingTest, MatchesCpuSampler) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  CheckAgainstCpu(200, 1000, 1);
  CheckAgainstCpu(64, 32000, 2);
  CheckAgainstCpu(33, 151936, 3);
  CheckAgainstCpu(40, 7, 4);
  // Few rows: many CTAs per row (SampleRows' group), parts that do not
  // divide the vocabulary, a vocabulary that is not a multiple of 4.
  CheckAgainstCpu(4, 151936, 5);
  CheckAgainstCpu(7, 128256, 6);
  CheckAgainstCpu(16, 50257, 7);
  CheckAgainstCpu(5, 40003, 8);
  CheckAgainstCpu(1, 128256, 9);
  // Many rows: one CTA per row (the group budget), long parts, each
  // thread's chunk of the final pass about 63 ids (also what every row
  // gets when the occupancy query fails).
  CheckAgainstCpu(300, 32000, 10);
}

// Top-p cutting through a run of equal logits that spans every CTA of the
// row's group and many threads' chunks: only the first ties by id survive
// (their count comes from the last radix level's mass), so each thread's
// share of them depends on the ties before it. Also min-p dropping those
// ties, and top-k leaving them all. Every draw must be the CPU's.
TEST(CudaSamplingTest, TopPCutsThroughTiesAcrossTheGroup) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  for (const int64_t vocab : {int64_t{128256}, int64_t{50001}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::vector<float> row(vocab, 0.0f);  // the ties
    for (int64_t i = 0; i < vocab; i += 61) row[i] = 2.5f;
    for (int64_t i = 7; i < vocab; i += 997) row[i] = -std::numeric_limits<float>::infinity();
    Batch b;
    b.vocab = vocab;
    const float top_ps[] = {0.3f, 0.5f, 0.9f, 0.99f, 1.0f};
    const float min_ps[] = {0.0f, 0.0f, 0.05f};
    const int32_t top_ks[] = {0, 0, 4000};
    const int rows = 12;
    for (int r = 0; r < rows; ++r) {
      b.logits.insert(b.logits.end(), row.begin(), row.end());
      RowSamplingParams p;
      p.temperature = r % 2 == 0 ? 1.0f : 0.5f;
      p.top_p = top_ps[r % 5];
      p.min_p = min_ps[r % 3];
      p.top_k = top_ks[(r / 3) % 3];
      p.seed = 77 + r;
      p.position = 1000 * r;
      b.params.push_back(p);
    }
    // Once with all rows (few CTAs each), once a row at a time (the
    // largest groups).
    const std::vector<int32_t> together = RunGpu(b);
    for (int r = 0; r < rows; ++r) {
      const RowSamplingParams& p = b.params[r];
      absl::StatusOr<sampling::SampleResult> want =
          sampling::Sample(row, CpuParams(p), {}, p.position);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(together[r], want->token)
          << "row " << r << " top_p " << p.top_p << " min_p " << p.min_p << " top_k " << p.top_k;
      Batch one;
      one.vocab = vocab;
      one.logits = row;
      one.params = {p};
      EXPECT_EQ(RunGpu(one)[0], want->token) << "alone, row " << r;
    }
  }
}

// A row's group of CTAs that cannot all run at once (another stream's
// kernel holds every SM but one for 6 s) must not hang the stream: the
// CTAs that run give up after 4 s and the row comes out -1. Once the SMs
// are free again the same call draws the CPU's token.
TEST(CudaSamplingTest, AGroupThatCannotAllRunGivesMinusOneInsteadOfHanging) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const CudaQueryResult devices = QueryCudaDevices();
  ASSERT_FALSE(devices.info.devices.empty());
  const int sms = devices.info.devices[0].sm_count;  // the test runs on device 0
  ASSERT_GT(sms, 1);
  Batch b = MakeBatch(1, 128256, 11);
  b.params[0].temperature = 1.0f;
  b.params[0].top_k = 0;
  b.params[0].top_p = 0.9f;
  b.params[0].min_p = 0.0f;
  DeviceBuffer d_logits = Upload(b.logits);
  DeviceBuffer d_params = Upload(b.params);
  DeviceBuffer d_out = Zeros(sizeof(int32_t));
  const size_t ws_bytes = SampleRowsWorkspaceBytes(1, b.vocab);
  DeviceBuffer d_ws = Zeros(ws_bytes);
  absl::StatusOr<Stream> hog = Stream::Create();
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(hog.ok() && stream.ok());
  auto sample = [&] {
    return SampleRows(d_logits.as<float>(), 1, b.vocab, d_params.as<RowSamplingParams>(),
                      d_out.as<int32_t>(), d_ws.data(), ws_bytes, stream->get());
  };
  ASSERT_TRUE(OccupySms(sms - 1, 6.0, hog->get()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the hog's CTAs are placed
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sample().ok());
  ASSERT_TRUE(Synchronize(stream->get()).ok());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(Download<int32_t>(d_out, 1)[0], -1);
  EXPECT_LT(waited, 30.0);
  ASSERT_TRUE(Synchronize(hog->get()).ok());

  ASSERT_TRUE(sample().ok());
  ASSERT_TRUE(Synchronize(stream->get()).ok());
  absl::StatusOr<sampling::SampleResult> want =
      sampling::Sample(b.logits, CpuParams(b.params[0]), {}, b.params[0].position);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(Download<int32_t>(d_out, 1)[0], want->token);
}

// Same logits row, many positions: the draw changes with the position and
// still matches the CPU every time.
TEST(CudaSamplingTest, PositionsDriveTheDraw) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t vocab = 50, rows = 300;
  Batch b;
  b.vocab = vocab;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> row(vocab);
  for (float& v : row) v = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    b.logits.insert(b.logits.end(), row.begin(), row.end());
    RowSamplingParams p;
    p.temperature = 1.0f;
    p.seed = 1234;
    p.position = r;
    b.params.push_back(p);
  }
  const std::vector<int32_t> got = RunGpu(b);
  int distinct = 0;
  std::vector<bool> seen(vocab, false);
  for (int64_t r = 0; r < rows; ++r) {
    absl::StatusOr<sampling::SampleResult> want =
        sampling::Sample(row, CpuParams(b.params[r]), {}, r);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got[r], want->token) << r;
    if (!seen[want->token]) ++distinct;
    seen[want->token] = true;
  }
  EXPECT_GT(distinct, 10);
}

TEST(CudaSamplingTest, InvalidRowsGiveMinusOne) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  const int64_t vocab = 16;
  Batch b;
  b.vocab = vocab;
  b.logits.assign(4 * vocab, 0.5f);
  b.logits[3] = std::numeric_limits<float>::quiet_NaN();  // row 0
  for (int64_t i = 0; i < vocab; ++i)
    b.logits[vocab + i] = -std::numeric_limits<float>::infinity();  // row 1
  b.params.resize(4);
  b.params[2].top_p = 1.5f;       // bad params
  b.params[3].temperature = 0.f;  // fine: greedy, all equal -> 0
  const std::vector<int32_t> got = RunGpu(b);
  EXPECT_EQ(got, (std::vector<int32_t>{-1, -1, -1, 0}));
}

// Checked on the host before anything is launched (runs without a device).
TEST(CudaSamplingTest, RefusesBadArgumentsOnTheHost) {
  EXPECT_FALSE(SampleRows(nullptr, 1, 10, nullptr, nullptr, nullptr, 0, nullptr).ok());
  // A workspace below SampleRowsWorkspaceBytes, or misaligned, and more
  // rows than a grid dimension holds are refused.
  alignas(16) static uint8_t small[64];
  const float* any_logits = reinterpret_cast<const float*>(small);
  const auto* any_params = reinterpret_cast<const RowSamplingParams*>(small);
  int32_t* any_out = reinterpret_cast<int32_t*>(small);
  EXPECT_EQ(
      SampleRows(any_logits, 1, 10, any_params, any_out, small, sizeof(small) - 1, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleRows(any_logits, 1, 10, any_params, any_out, small + 4,
                       SampleRowsWorkspaceBytes(1, 10), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SampleRows(any_logits, 70000, 10, any_params, any_out, small, sizeof(small), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  // The test helper that holds SMs busy refuses bad arguments before any launch.
  EXPECT_EQ(OccupySms(0, 1.0, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OccupySms(4, 0.0, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OccupySms(4, 61.0, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::kernels::cuda
