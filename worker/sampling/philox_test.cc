#include "worker/sampling/philox.h"

#include <set>

#include "gtest/gtest.h"

namespace tessera::sampling {
namespace {

// Known-answer vectors from Random123's kat_vectors file ("philox4x32 10"
// lines: counter, key -> output).
TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  struct Kat {
    PhiloxCounter counter;
    PhiloxKey key;
    PhiloxCounter expected;
  } kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) EXPECT_EQ(Philox4x32(kat.counter, kat.key), kat.expected);
}

TEST(PhiloxTest, UniformIsInRangeAndKeyedBySeedPositionAndStream) {
  std::set<double> seen;
  for (uint64_t position = 0; position < 1000; ++position) {
    const double u = UniformFromSeed(42, position, RandomStream::kSample);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    seen.insert(u);
    EXPECT_EQ(u, UniformFromSeed(42, position, RandomStream::kSample)) << "not repeatable";
  }
  EXPECT_EQ(seen.size(), 1000u) << "53-bit draws should not collide in 1000 tries";
  EXPECT_NE(UniformFromSeed(42, 7, RandomStream::kSample),
            UniformFromSeed(43, 7, RandomStream::kSample));
  EXPECT_NE(UniformFromSeed(42, 7, RandomStream::kSample),
            UniformFromSeed(42, 7, RandomStream::kSpeculativeAccept));
  EXPECT_NE(UniformFromSeed(42, 7, RandomStream::kSample),
            UniformFromSeed(42, 7 + (uint64_t{1} << 32), RandomStream::kSample))
      << "the high half of the position must matter";
}

TEST(PhiloxTest, UniformMeanAndVarianceAreThoseOfU01) {
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double u = UniformFromSeed(7, static_cast<uint64_t>(i), RandomStream::kSample);
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard errors: sqrt(1/12 / n) = 6.5e-4 for the mean; 5 sigma bounds.
  EXPECT_NEAR(mean, 0.5, 5 * 6.5e-4);
  EXPECT_NEAR(var, 1.0 / 12.0, 5 * 2.0e-4);
}

}  // namespace
}  // namespace tessera::sampling
