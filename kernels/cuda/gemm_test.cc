// Parity tests of the cuBLASLt GEMM against the CPU reference GEMM, and a
// CUDA-graph capture/replay test (embedding -> rmsnorm -> gemm). Skipped
// without a CUDA device.
//
// Tolerances: with fp32 accumulation in another order than the reference's
// double sum, |y - ref| <= 1e-4 * sum_k |x w| (+ 2^-8 |ref| for bf16 output,
// one rounding). Large shapes are checked on a sample of output columns
// (the reference on all of them would take minutes).
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rmsnorm.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::CaptureGraph;
using cuda_testing::Download;
using cuda_testing::FastRandomBf16;
using cuda_testing::FromBf16;
using cuda_testing::kBf16Eps;
using cuda_testing::RandomFloats;
using cuda_testing::ToBf16;
using cuda_testing::Upload;
using cuda_testing::Zeros;
namespace ref = ::tessera::kernels::cpu::reference;

struct Shape {
  int64_t m, n, k;
  bool bias;
  bool f32_out;
};

void CheckGemm(GemmContext& ctx, const Shape& sh) {
  SCOPED_TRACE(::testing::Message() << "m " << sh.m << " n " << sh.n << " k " << sh.k << " bias "
                                    << sh.bias << " f32 " << sh.f32_out);
  const std::vector<Bf16> x = FastRandomBf16(sh.m * sh.k, 1 + sh.m);
  const std::vector<Bf16> w = FastRandomBf16(sh.n * sh.k, 2 + sh.n);
  const std::vector<float> bias = RandomFloats(sh.n, 3, -2.f, 2.f);
  DeviceBuffer d_x = Upload(x), d_w = Upload(w), d_b = Upload(bias);
  DeviceBuffer d_y = Zeros(sh.m * sh.n * (sh.f32_out ? 4 : 2));
  const float* b = sh.bias ? d_b.as<float>() : nullptr;
  absl::Status s =
      sh.f32_out
          ? ctx.Gemm(d_x.as<Bf16>(), sh.m, sh.k, d_w.as<Bf16>(), sh.n, b, d_y.as<float>(), nullptr)
          : ctx.Gemm(d_x.as<Bf16>(), sh.m, sh.k, d_w.as<Bf16>(), sh.n, b, d_y.as<Bf16>(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> y;
  if (sh.f32_out) {
    y = Download<float>(d_y, sh.m * sh.n);
  } else {
    y = FromBf16(Download<Bf16>(d_y, sh.m * sh.n));
  }
  // Sampled columns (all when n is small).
  std::vector<int64_t> cols;
  if (sh.n <= 512) {
    for (int64_t j = 0; j < sh.n; ++j) cols.push_back(j);
  } else {
    std::mt19937 rng(4);
    for (int i = 0; i < 61; ++i) cols.push_back(rng() % sh.n);
    cols.push_back(0);
    cols.push_back(sh.n - 1);
  }
  std::vector<Bf16> w_sub(cols.size() * sh.k);
  std::vector<float> b_sub(cols.size()), abs_w(cols.size() * sh.k);
  for (size_t c = 0; c < cols.size(); ++c) {
    for (int64_t p = 0; p < sh.k; ++p) w_sub[c * sh.k + p] = w[cols[c] * sh.k + p];
    b_sub[c] = bias[cols[c]];
  }
  const std::vector<float> xf = FromBf16(x);
  std::vector<float> want(sh.m * cols.size());
  cpu::WeightMatrix wm{w_sub.data(), cpu::DType::kBF16, static_cast<int64_t>(cols.size()), sh.k};
  ref::Gemm(xf.data(), sh.m, wm, sh.bias ? b_sub.data() : nullptr, want.data());
  const std::vector<float> wf = FromBf16(w_sub);
  for (int64_t i = 0; i < sh.m; ++i) {
    for (size_t c = 0; c < cols.size(); ++c) {
      double mag = 0;
      for (int64_t p = 0; p < sh.k; ++p)
        mag += std::fabs(double{xf[i * sh.k + p]} * wf[c * sh.k + p]);
      const double r = want[i * cols.size() + c];
      const double tol = 1e-4 * mag + (sh.f32_out ? 1e-6 : kBf16Eps * std::fabs(r) + 1e-6);
      ASSERT_NEAR(y[i * sh.n + cols[c]], r, tol) << "row " << i << " col " << cols[c];
    }
  }
}

TEST(CudaGemmTest, MatchesReference) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const Shape shapes[] = {
      {1, 4096, 4096, false, false},   {7, 6144, 4096, true, false},
      {64, 4096, 14336, false, false}, {1, 4096, 14336, false, false},
      {33, 129, 72, true, false},      {5, 1001, 200, true, false},
      {3, 97, 77, true, false},        {1, 32000, 4096, false, true},
      {7, 32000, 4096, true, true},    {64, 28672, 4096, false, false},
      {64, 96, 64, false, true},       {2100, 4096, 128, true, false},  // 2 scratch chunks
  };
  for (const Shape& sh : shapes) {
    CheckGemm(**ctx, sh);
    CheckGemm(**ctx, sh);  // cached plan
  }
  EXPECT_TRUE(
      (*ctx)->Gemm(nullptr, 0, 8, nullptr, 8, nullptr, static_cast<Bf16*>(nullptr), nullptr).ok());
  EXPECT_FALSE(
      (*ctx)->Gemm(nullptr, 1, 8, nullptr, 8, nullptr, static_cast<Bf16*>(nullptr), nullptr).ok());
}

// The first `count` bf16 values of `got` equal `want`'s, bit for bit.
void ExpectSameBf16(const DeviceBuffer& want, const DeviceBuffer& got, int64_t count) {
  const std::vector<Bf16> a = Download<Bf16>(want, count), b = Download<Bf16>(got, count);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(Bf16ToFloat(b[i]), Bf16ToFloat(a[i])) << i;
  }
}

// A context that tunes its cuBLASLt algorithms (SetAutotune) still matches
// the reference, with and without bias and fp32 output, for shapes within
// and beyond the bound; a tuned shape then gives the same bytes on every
// call, eager and from a graph.
TEST(CudaGemmTest, AutotunedPlansMatchReferenceAndRepeat) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  (*ctx)->SetAutotune(64);
  const Shape shapes[] = {{64, 4096, 2048, false, false},
                          {16, 1001, 200, true, false},
                          {64, 3072, 4096, true, false},
                          {40, 32000, 512, false, true},
                          {65, 512, 256, false, false}};  // above the bound: not tuned
  for (const Shape& sh : shapes) {
    CheckGemm(**ctx, sh);
    CheckGemm(**ctx, sh);
  }
  const int64_t m = 64, n = 2048, k = 1024;
  DeviceBuffer x = Upload(FastRandomBf16(m * k, 7)), w = Upload(FastRandomBf16(n * k, 8));
  DeviceBuffer y0 = Zeros(m * n * 2), y1 = Zeros(m * n * 2), y2 = Zeros(m * n * 2);
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  const CudaStream st = stream->get();
  ASSERT_TRUE((*ctx)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, y0.as<Bf16>(), st).ok());
  ASSERT_TRUE((*ctx)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, y1.as<Bf16>(), st).ok());
  CudaGraph graph;
  ASSERT_TRUE(graph.BeginCapture(st).ok());
  ASSERT_TRUE((*ctx)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, y2.as<Bf16>(), st).ok());
  ASSERT_TRUE(graph.EndCapture().ok());
  ASSERT_TRUE(graph.Launch(st).ok());
  ASSERT_TRUE(Synchronize(st).ok());
  ExpectSameBf16(y0, y1, m * n);
  ExpectSameBf16(y0, y2, m * n);
}

// A shape first met inside a stream capture cannot be timed there, so it
// keeps the heuristic's first algorithm for good: the graph and every later
// eager call give the bits of an untuned context's call.
TEST(CudaGemmTest, ShapeFirstSeenInCaptureKeepsTheHeuristicAlgorithm) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<std::unique_ptr<GemmContext>> tuned = GemmContext::Create();
  absl::StatusOr<std::unique_ptr<GemmContext>> plain = GemmContext::Create();
  ASSERT_TRUE(tuned.ok() && plain.ok());
  (*tuned)->SetAutotune(64);
  const int64_t m = 64, n = 1536, k = 1024;
  DeviceBuffer x = Upload(FastRandomBf16(m * k, 17)), w = Upload(FastRandomBf16(n * k, 18));
  DeviceBuffer ref = Zeros(m * n * 2), in_graph = Zeros(m * n * 2), eager = Zeros(m * n * 2);
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  const CudaStream st = stream->get();
  ASSERT_TRUE(
      (*plain)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, ref.as<Bf16>(), st).ok());
  CudaGraph graph;
  ASSERT_TRUE(graph.BeginCapture(st).ok());
  ASSERT_TRUE(
      (*tuned)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, in_graph.as<Bf16>(), st).ok());
  ASSERT_TRUE(graph.EndCapture().ok());
  ASSERT_TRUE(graph.Launch(st).ok());
  ASSERT_TRUE(
      (*tuned)->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), n, nullptr, eager.as<Bf16>(), st).ok());
  ASSERT_TRUE(Synchronize(st).ok());
  ExpectSameBf16(ref, in_graph, m * n);
  ExpectSameBf16(ref, eager, m * n);
}

// Contexts sharing a GemmTuningTable (the ranks of a tensor-parallel group):
// a shape one of them tuned is not timed again by another, which runs the
// same algorithm (the same bits); two contexts meeting a new shape at once
// time it once between them. A context outside the table times for itself.
TEST(CudaGemmTest, SharedTuningTimesEachShapeOnce) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  auto table = std::make_shared<GemmTuningTable>();
  std::vector<std::unique_ptr<GemmContext>> ctx;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<GemmContext>> c = GemmContext::Create();
    ASSERT_TRUE(c.ok()) << c.status();
    (*c)->SetAutotune(64);
    if (i < 2) (*c)->ShareTuning(table);
    ctx.push_back(std::move(*c));
  }
  const int64_t m = 64, n = 3072, k = 1024;
  DeviceBuffer x = Upload(FastRandomBf16(m * k, 27)), w = Upload(FastRandomBf16(n * k, 28));
  std::vector<DeviceBuffer> y;
  for (int i = 0; i < 3; ++i) y.push_back(Zeros(m * n * 2));
  auto run = [&](int i, int64_t cols) {
    absl::StatusOr<Stream> stream = Stream::Create();
    if (!stream.ok()) return stream.status();
    absl::Status s = ctx[i]->Gemm(x.as<Bf16>(), m, k, w.as<Bf16>(), cols, nullptr, y[i].as<Bf16>(),
                                  stream->get());
    if (!s.ok()) return s;
    return Synchronize(stream->get());
  };
  ASSERT_TRUE(run(0, n).ok());
  ASSERT_TRUE(run(1, n).ok());
  ASSERT_TRUE(run(2, n).ok());
  EXPECT_EQ(ctx[0]->shapes_timed(), 1);
  EXPECT_EQ(ctx[1]->shapes_timed(), 0);  // took context 0's pick
  EXPECT_EQ(ctx[2]->shapes_timed(), 1);  // not in the table
  ExpectSameBf16(y[0], y[1], m * n);
  // A new shape met by both sharing contexts at once, from two threads.
  absl::Status s0, s1;
  std::thread t0([&] { s0 = run(0, n / 2); });
  std::thread t1([&] { s1 = run(1, n / 2); });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(ctx[0]->shapes_timed() + ctx[1]->shapes_timed(), 2);
  ExpectSameBf16(y[0], y[1], m * n / 2);
}

// The contexts waiting for a shared pick time their own candidates when the
// tuner could time none or when cuBLASLt refuses its pick for their
// operands, and still compute the right product.
TEST(CudaGemmTest, SharedTuningTimesLocallyWhenThePickIsMissingOrRefused) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  using Outcome = GemmTuningTable::TestOutcome;
  for (const Outcome outcome : {Outcome::kNothingTimed, Outcome::kUnusablePick}) {
    SCOPED_TRACE(outcome == Outcome::kNothingTimed ? "nothing timed" : "unusable pick");
    auto table = std::make_shared<GemmTuningTable>();
    table->SetNextOutcomeForTest(outcome);
    std::vector<std::unique_ptr<GemmContext>> ctx;
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<GemmContext>> c = GemmContext::Create();
      ASSERT_TRUE(c.ok()) << c.status();
      (*c)->SetAutotune(64);
      (*c)->ShareTuning(table);
      ctx.push_back(std::move(*c));
    }
    const Shape shape{64, 1536, 1024, false, false};
    CheckGemm(*ctx[0], shape);  // tunes the shape for the table
    CheckGemm(*ctx[1], shape);  // cannot take the pick
    EXPECT_EQ(ctx[0]->shapes_timed(), 1);
    EXPECT_EQ(ctx[1]->shapes_timed(), 1);
    EXPECT_EQ(ctx[1]->picks_refused(), outcome == Outcome::kUnusablePick ? 1 : 0);
    // The next shape is published normally again and taken.
    const Shape next{64, 768, 1024, false, false};
    CheckGemm(*ctx[0], next);
    CheckGemm(*ctx[1], next);
    EXPECT_EQ(ctx[0]->shapes_timed(), 2);
    EXPECT_EQ(ctx[1]->shapes_timed(), 1);
  }
}

// Captures embedding -> rmsnorm -> gemm (+bias) on a stream, replays the graph with
// new ids written into the same input buffer, and compares with direct calls.
TEST(CudaGraphTest, CaptureAndReplayMatchesDirectCalls) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<std::unique_ptr<GemmContext>> ctx = GemmContext::Create();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const int64_t vocab = 1000, hidden = 512, n = 768, tokens = 5;
  DeviceBuffer table = Upload(FastRandomBf16(vocab * hidden, 5));
  DeviceBuffer w = Upload(FastRandomBf16(n * hidden, 6));
  DeviceBuffer norm_w = Upload(RandomFloats(hidden, 7, 0.5f, 1.5f));
  DeviceBuffer bias = Upload(RandomFloats(n, 8, -1.f, 1.f));
  DeviceBuffer ids = Zeros(tokens * 4);
  DeviceBuffer act = Zeros(tokens * hidden * 4);
  DeviceBuffer normed = Zeros(tokens * hidden * 2);
  DeviceBuffer y = Zeros(tokens * n * 2);
  CudaStream s = stream->get();
  auto run = [&]() -> absl::Status {
    if (absl::Status st = Embedding(table.as<Bf16>(), vocab, hidden, ids.as<int32_t>(), tokens,
                                    act.as<float>(), s);
        !st.ok()) {
      return st;
    }
    if (absl::Status st = RmsNorm(act.as<float>(), tokens, hidden, norm_w.as<float>(), 1e-5f,
                                  normed.as<Bf16>(), s);
        !st.ok()) {
      return st;
    }
    return (*ctx)->Gemm(normed.as<Bf16>(), tokens, hidden, w.as<Bf16>(), n, bias.as<float>(),
                        y.as<Bf16>(), s);
  };
  const std::vector<int32_t> ids_a = {1, 2, 3, 999, 0}, ids_b = {500, 7, 7, 42, 998};
  // Direct results.
  std::vector<std::vector<Bf16>> direct;
  for (const auto& v : {ids_a, ids_b}) {
    ASSERT_TRUE(CopyToDevice(ids.data(), v.data(), v.size() * 4, s).ok());
    ASSERT_TRUE(run().ok());
    ASSERT_TRUE(Synchronize(s).ok());
    direct.push_back(Download<Bf16>(y, tokens * n));
  }
  EXPECT_NE(direct[0], direct[1]);
  // Capture (the GEMM plan is already warm), then replay with each input.
  CudaGraph graph;
  const absl::Status captured = CaptureGraph(s, &graph, [&] { return run(); });
  ASSERT_TRUE(captured.ok()) << captured;
  for (int rep = 0; rep < 2; ++rep) {
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<int32_t>& v = i == 0 ? ids_a : ids_b;
      ASSERT_TRUE(MemsetDevice(y.data(), 0, y.size(), s).ok());
      ASSERT_TRUE(CopyToDevice(ids.data(), v.data(), v.size() * 4, s).ok());
      ASSERT_TRUE(graph.Launch(s).ok());
      ASSERT_TRUE(Synchronize(s).ok());
      EXPECT_EQ(Download<Bf16>(y, tokens * n), direct[i]) << "rep " << rep << " input " << i;
    }
  }
  EXPECT_FALSE(graph.BeginCapture(nullptr).ok());
}

}  // namespace
}  // namespace tessera::kernels::cuda
