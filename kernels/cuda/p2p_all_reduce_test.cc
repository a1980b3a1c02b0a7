// The peer-to-peer all-reduce (p2p_all_reduce.h) on every GPU of the host
// (skipped with fewer than two, or without peer access): for message sizes
// that take the 16-byte and the element path and 1 to 32 CTAs, every rank
// ends with the fp32 sum of all ranks' values rounded once to bf16, bitwise
// the same on every rank; many rounds in a row (the inbox halves alternate),
// eager and replayed from CUDA graphs; no call times out; counts above the
// capacity are refused.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda/p2p_all_reduce.h"

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
  // or a start 2 bytes past alignment); 1 CTA up to 32 CTAs.
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

}  // namespace
}  // namespace tessera::kernels::cuda
