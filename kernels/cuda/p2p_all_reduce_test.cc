// The peer-to-peer all-reduce (p2p_all_reduce.h) on every GPU of the host
// (skipped with fewer than two, or without peer access): for message sizes
// that take the 16-byte and the element path and 1 to 128 CTAs, every rank
// ends with the fp32 sum of all ranks' values rounded once to bf16, bitwise
// the same on every rank; many rounds in a row (the inboxes rotate),
// eager and replayed from CUDA graphs; no call times out; counts above the
// capacity are refused; -0.0 values (the protocol's empty marker) are sent
// as +0.0; the fused residual add + RMSNorm matches the all-reduce followed
// by FusedAddRmsNorm; a rank whose peer never calls times out instead of
// hanging, and says so (TakeTimedOut) and where it stands (CallIndex).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda/rmsnorm.h"

namespace tessera::kernels::cuda {
namespace {

struct Group {
  std::vector<int> ordinals;
  std::unique_ptr<P2pAllReduce> p2p;
  std::vector<Stream> streams;
  std::vector<DeviceBuffer> data;
};

// Rank r's value at element i in round `round`: small integers (exact in
// bf16 and in their sum), different per rank, element and round.
float Value(int r, int64_t i, int round) {
  return static_cast<float>((r * 7 + i * 13 + round * 5) % 61) - 30.f;
}

constexpr int64_t kCapacity = int64_t{1} << 19;  // 1 MiB of bf16

bool MakeGroup(Group* g, std::string* why) {
  const int n = CudaDeviceCount(why);
  if (n < 2) return false;
  for (int i = 0; i < n && i < 8; ++i) g->ordinals.push_back(i);
  if (!AllPeersAccessible(g->ordinals)) {
    *why = "the GPUs cannot access each other's memory";
    return false;
  }
  absl::StatusOr<std::unique_ptr<P2pAllReduce>> p = P2pAllReduce::Create(g->ordinals, kCapacity);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return false;
  g->p2p = std::move(*p);
  for (int o : g->ordinals) {
    EXPECT_TRUE(SetDevice(o).ok());
    absl::StatusOr<Stream> s = Stream::Create();
    EXPECT_TRUE(s.ok());
    g->streams.push_back(std::move(*s));
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(kCapacity * sizeof(Bf16) + 16);
    EXPECT_TRUE(b.ok());
    g->data.push_back(std::move(*b));
  }
  return true;
}

// Fills every rank's buffer (starting `offset_elems` in) for `round`.
void Fill(Group& g, int64_t count, int64_t offset_elems, int round) {
  for (size_t r = 0; r < g.ordinals.size(); ++r) {
    ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
    std::vector<Bf16> host(count);
    for (int64_t i = 0; i < count; ++i) host[i] = FloatToBf16(Value(static_cast<int>(r), i, round));
    ASSERT_TRUE(CopyToDevice(g.data[r].as<Bf16>() + offset_elems, host.data(), count * sizeof(Bf16),
                             g.streams[r].get())
                    .ok());
  }
}

void Check(Group& g, int64_t count, int64_t offset_elems, int round) {
  const int n = static_cast<int>(g.ordinals.size());
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
    ASSERT_TRUE(Synchronize(g.streams[r].get()).ok());
    std::vector<Bf16> host(count);
    ASSERT_TRUE(
        CopyToHost(host.data(), g.data[r].as<Bf16>() + offset_elems, count * sizeof(Bf16)).ok());
    for (int64_t i = 0; i < count; ++i) {
      float want = 0.f;
      for (int q = 0; q < n; ++q) want += Value(q, i, round);
      ASSERT_EQ(Bf16ToFloat(host[i]), want)
          << "rank " << r << " element " << i << " of " << count << " round " << round;
    }
  }
}

TEST(P2pAllReduceTest, SumsOnEveryRankForManySizesAndRounds) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Group g;
  std::string why;
  if (!MakeGroup(&g, &why)) GTEST_SKIP() << why;
  int round = 0;
  // 16-byte path (count % 8 == 0, aligned) and element path (odd counts,
  // or a start 2 bytes past alignment); 1 CTA up to 128 CTAs.
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4096}, int64_t{8191},
                        int64_t{65536}, int64_t{262144}, kCapacity}) {
    for (int64_t offset : {int64_t{0}, int64_t{1}}) {
      if (count + offset > kCapacity + 8) continue;
      SCOPED_TRACE(::testing::Message() << count << " values at +" << offset);
      for (int rep = 0; rep < 3; ++rep, ++round) {
        Fill(g, count, offset, round);
        for (size_t r = 0; r < g.ordinals.size(); ++r) {
          ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
          ASSERT_TRUE(g.p2p
                          ->AllReduceSumBf16(static_cast<int>(r), g.data[r].as<Bf16>() + offset,
                                             count, g.streams[r].get())
                          .ok());
        }
        Check(g, count, offset, round);
      }
    }
  }
  for (size_t r = 0; r < g.ordinals.size(); ++r) {
    absl::StatusOr<uint32_t> t = g.p2p->Timeouts(static_cast<int>(r));
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, 0u) << "rank " << r;
  }
  EXPECT_FALSE(
      g.p2p->AllReduceSumBf16(0, g.data[0].as<Bf16>(), kCapacity + 1, g.streams[0].get()).ok());
}

TEST(P2pAllReduceTest, GraphReplaysReduceAgain) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Group g;
  std::string why;
  if (!MakeGroup(&g, &why)) GTEST_SKIP() << why;
  const int64_t count = 4096;  // one step's activation at batch 1 (8 KB)
  const int n = static_cast<int>(g.ordinals.size());
  std::vector<CudaGraph> graphs(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
    ASSERT_TRUE(graphs[r].BeginCapture(g.streams[r].get()).ok());
    ASSERT_TRUE(g.p2p->AllReduceSumBf16(r, g.data[r].as<Bf16>(), count, g.streams[r].get()).ok());
    ASSERT_TRUE(graphs[r].EndCapture().ok());
  }
  for (int round = 0; round < 6; ++round) {
    Fill(g, count, 0, round);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
      ASSERT_TRUE(graphs[r].Launch(g.streams[r].get()).ok());
    }
    Check(g, count, 0, round);
  }
}

// Every rank sends -0.0 in some slots (the empty marker of the inboxes):
// the call must still complete (no rank waits for a "missing" value) and
// sum them as zeros.
TEST(P2pAllReduceTest, NegativeZeroIsAValue) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Group g;
  std::string why;
  if (!MakeGroup(&g, &why)) GTEST_SKIP() << why;
  const int n = static_cast<int>(g.ordinals.size());
  for (int64_t count : {int64_t{4096}, int64_t{333}}) {  // the 16-byte and the element path
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
      std::vector<Bf16> host(count);
      for (int64_t i = 0; i < count; ++i) {
        host[i] = FloatToBf16(i % 3 == 0 ? -0.0f : static_cast<float>(i % 5 + r));
      }
      ASSERT_TRUE(CopyToDevice(g.data[r].data(), host.data(), count * 2, g.streams[r].get()).ok());
      ASSERT_TRUE(g.p2p->AllReduceSumBf16(r, g.data[r].as<Bf16>(), count, g.streams[r].get()).ok());
    }
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
      ASSERT_TRUE(Synchronize(g.streams[r].get()).ok());
      std::vector<Bf16> host(count);
      ASSERT_TRUE(CopyToHost(host.data(), g.data[r].data(), count * 2).ok());
      for (int64_t i = 0; i < count; ++i) {
        float want = 0.f;
        for (int q = 0; q < n; ++q) want += i % 3 == 0 ? 0.f : static_cast<float>(i % 5 + q);
        ASSERT_EQ(Bf16ToFloat(host[i]), want) << "rank " << r << " element " << i;
      }
      absl::StatusOr<uint32_t> t = g.p2p->Timeouts(r);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(*t, 0u) << "rank " << r;
    }
  }
}

// AllReduceAddRmsNorm against AllReduceSumBf16 + FusedAddRmsNorm on the same
// inputs: the residual bitwise, the normalized output within one bf16
// rounding (the sum of squares is reduced in a different order). Row counts
// from one row (one CTA) to more rows than CTAs, interleaved with plain
// all-reduces of other sizes (the rotating inboxes), eager and from a graph.
// AllReduceRmsNorm the same way against a zero residual, its own residual
// filled with NaNs first (it must not read them).
TEST(P2pAllReduceTest, FusedAddRmsNormMatchesAllReduceThenNorm) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Group g;
  std::string why;
  if (!MakeGroup(&g, &why)) GTEST_SKIP() << why;
  const int n = static_cast<int>(g.ordinals.size());
  const int64_t max_cols = 4096;
  const float eps = 1e-5f;
  struct RankBuffers {
    DeviceBuffer delta, residual, residual_ref, w, out, out_ref;
  };
  std::vector<RankBuffers> b(n);
  const int64_t max_values = kCapacity;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
    for (DeviceBuffer* d : {&b[r].delta, &b[r].out, &b[r].out_ref}) {
      *d = std::move(*DeviceBuffer::Allocate(max_values * 2));
    }
    for (DeviceBuffer* d : {&b[r].residual, &b[r].residual_ref}) {
      *d = std::move(*DeviceBuffer::Allocate(max_values * 4));
    }
    b[r].w = std::move(*DeviceBuffer::Allocate(max_cols * 4));
    std::vector<float> w(max_cols);
    for (int64_t i = 0; i < max_cols; ++i) w[i] = 0.5f + static_cast<float>(i % 7) * 0.125f;
    ASSERT_TRUE(CopyToDevice(b[r].w.data(), w.data(), max_cols * 4, g.streams[r].get()).ok());
  }
  int round = 100;
  struct Shape {
    int64_t rows, cols;
  };
  // 300 rows of 1024: more rows than the kernel's 128 CTAs.
  for (const Shape& shape :
       {Shape{1, 4096}, Shape{3, 4096}, Shape{64, 4096}, Shape{300, 1024}, Shape{1, 4096}}) {
    const int64_t rows = shape.rows, cols = shape.cols;
    for (const int mode : {0, 1, 2}) {
      const bool via_graph = mode == 1;
      const bool accumulate = mode != 2;
      SCOPED_TRACE(::testing::Message()
                   << rows << " rows of " << cols << (via_graph ? " from a graph" : "")
                   << (accumulate ? "" : ", residual set"));
      const int64_t count = rows * cols;
      // Inputs: delta differs per rank; the residual is the same on every rank.
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
        std::vector<Bf16> delta(count);
        std::vector<float> residual(count);
        for (int64_t i = 0; i < count; ++i) {
          delta[i] = FloatToBf16(Value(r, i, round) * 0.25f);
          residual[i] = static_cast<float>((i * 29 + round) % 17) - 8.f;
        }
        ASSERT_TRUE(
            CopyToDevice(b[r].delta.data(), delta.data(), count * 2, g.streams[r].get()).ok());
        std::vector<float> residual_in = residual;
        if (!accumulate) {
          std::fill(residual.begin(), residual.end(), 0.f);
          std::fill(residual_in.begin(), residual_in.end(), std::nanf(""));
        }
        ASSERT_TRUE(
            CopyToDevice(b[r].residual.data(), residual_in.data(), count * 4, g.streams[r].get())
                .ok());
        ASSERT_TRUE(
            CopyToDevice(b[r].residual_ref.data(), residual.data(), count * 4, g.streams[r].get())
                .ok());
      }
      // Reference: the plain all-reduce (into the data buffers), then the
      // norm. One host thread drives every rank here, so each loop enqueues
      // one kind of work on all ranks before the next: a kernel's first
      // launch (lazy module loading) or a graph's instantiation may wait
      // for the device's running kernels, and a rank's all-reduce runs
      // until its peers' calls arrive.
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
        ASSERT_TRUE(
            CopyDeviceToDevice(g.data[r].data(), b[r].delta.data(), count * 2, g.streams[r].get())
                .ok());
        ASSERT_TRUE(
            g.p2p->AllReduceSumBf16(r, g.data[r].as<Bf16>(), count, g.streams[r].get()).ok());
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
        ASSERT_TRUE(FusedAddRmsNorm(g.data[r].as<Bf16>(), b[r].residual_ref.as<float>(), rows, cols,
                                    b[r].w.as<float>(), eps, b[r].out_ref.as<Bf16>(),
                                    g.streams[r].get())
                        .ok());
      }
      std::vector<CudaGraph> graphs(n);
      auto fused = [&](int r) {
        return accumulate
                   ? g.p2p->AllReduceAddRmsNorm(r, b[r].delta.as<Bf16>(), b[r].residual.as<float>(),
                                                rows, cols, b[r].w.as<float>(), eps,
                                                b[r].out.as<Bf16>(), g.streams[r].get())
                   : g.p2p->AllReduceRmsNorm(r, b[r].delta.as<Bf16>(), b[r].residual.as<float>(),
                                             rows, cols, b[r].w.as<float>(), eps,
                                             b[r].out.as<Bf16>(), g.streams[r].get());
      };
      if (via_graph) {
        for (int r = 0; r < n; ++r) {
          ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
          ASSERT_TRUE(Synchronize(g.streams[r].get()).ok());
          ASSERT_TRUE(graphs[r].BeginCapture(g.streams[r].get()).ok());
          ASSERT_TRUE(fused(r).ok());
          ASSERT_TRUE(graphs[r].EndCapture().ok());
        }
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
        ASSERT_TRUE((via_graph ? graphs[r].Launch(g.streams[r].get()) : fused(r)).ok());
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SetDevice(g.ordinals[r]).ok());
        ASSERT_TRUE(Synchronize(g.streams[r].get()).ok());
        std::vector<float> res(count), res_ref(count);
        std::vector<Bf16> out(count), out_ref(count);
        ASSERT_TRUE(CopyToHost(res.data(), b[r].residual.data(), count * 4).ok());
        ASSERT_TRUE(CopyToHost(res_ref.data(), b[r].residual_ref.data(), count * 4).ok());
        ASSERT_TRUE(CopyToHost(out.data(), b[r].out.data(), count * 2).ok());
        ASSERT_TRUE(CopyToHost(out_ref.data(), b[r].out_ref.data(), count * 2).ok());
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(res[i], res_ref[i]) << "rank " << r << " residual " << i;
          const float o = Bf16ToFloat(out[i]), o_ref = Bf16ToFloat(out_ref[i]);
          ASSERT_LE(std::fabs(o - o_ref), std::fabs(o_ref) * (1.f / 128.f) + 1e-6f)
              << "rank " << r << " out " << i << ": " << o << " vs " << o_ref;
        }
        absl::StatusOr<uint32_t> t = g.p2p->Timeouts(r);
        ASSERT_TRUE(t.ok());
        EXPECT_EQ(*t, 0u) << "rank " << r;
      }
      ++round;
    }
  }
  // Shapes the fused kernel does not take are refused, not run.
  ASSERT_TRUE(SetDevice(g.ordinals[0]).ok());
  EXPECT_FALSE(P2pAllReduce::AddRmsNormSupports(b[0].delta.as<Bf16>(), b[0].residual.as<float>(),
                                                4100, b[0].w.as<float>(), b[0].out.as<Bf16>()));
  EXPECT_FALSE(g.p2p
                   ->AllReduceAddRmsNorm(0, b[0].delta.as<Bf16>(), b[0].residual.as<float>(), 1,
                                         4100, b[0].w.as<float>(), eps, b[0].out.as<Bf16>(),
                                         g.streams[0].get())
                   .ok());
  EXPECT_FALSE(g.p2p
                   ->AllReduceAddRmsNorm(0, b[0].delta.as<Bf16>(), b[0].residual.as<float>(),
                                         kCapacity / max_cols + 1, max_cols, b[0].w.as<float>(),
                                         eps, b[0].out.as<Bf16>(), g.streams[0].get())
                   .ok());
}

// A peer that never makes its call (a dead rank): the caller gives up after
// its bounded wait and counts a timeout, for both forms, instead of hanging
// the device.
TEST(P2pAllReduceTest, MissingPeerTimesOutInsteadOfHanging) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  Group g;
  std::string why;
  if (!MakeGroup(&g, &why)) GTEST_SKIP() << why;
  const int64_t cols = 4096;  // one row: one CTA for each form
  ASSERT_TRUE(SetDevice(g.ordinals[0]).ok());
  absl::StatusOr<DeviceBuffer> residual = DeviceBuffer::Allocate(cols * 4);
  absl::StatusOr<DeviceBuffer> w = DeviceBuffer::Allocate(cols * 4);
  absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Allocate(cols * 2);
  ASSERT_TRUE(residual.ok() && w.ok() && out.ok());
  Fill(g, cols, 0, 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(g.p2p->AllReduceSumBf16(0, g.data[0].as<Bf16>(), cols, g.streams[0].get()).ok());
  ASSERT_TRUE(g.p2p
                  ->AllReduceAddRmsNorm(0, g.data[0].as<Bf16>(), residual->as<float>(), 1, cols,
                                        w->as<float>(), 1e-5f, out->as<Bf16>(), g.streams[0].get())
                  .ok());
  ASSERT_TRUE(Synchronize(g.streams[0].get()).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);
  absl::StatusOr<uint32_t> timeouts = g.p2p->Timeouts(0);
  ASSERT_TRUE(timeouts.ok());
  EXPECT_EQ(*timeouts, 2u);  // one CTA per call
  // The host-visible word says so once, and rank 0 is now two calls ahead.
  EXPECT_TRUE(g.p2p->TakeTimedOut(0));
  EXPECT_FALSE(g.p2p->TakeTimedOut(0));
  EXPECT_FALSE(g.p2p->TakeTimedOut(1));
  absl::StatusOr<uint32_t> ahead = g.p2p->CallIndex(0), behind = g.p2p->CallIndex(1);
  ASSERT_TRUE(ahead.ok() && behind.ok());
  EXPECT_EQ(*ahead, (*behind + 2) % 3);
}

}  // namespace
}  // namespace tessera::kernels::cuda
