// PatchTokensFromPrevious against a host loop (the reference: a gather,
// exact), and PinnedStaging's alternating buffers: each staged copy lands
// whole even when the next one is filled before the stream ran it. Cases
// without a device check argument errors only.
#include "kernels/cuda/token_patch.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/pinned_buffer.h"

namespace tessera::kernels::cuda {
namespace {

using cuda_testing::Download;
using cuda_testing::Upload;

TEST(PatchTokensTest, FillsPlaceholdersFromThePreviousDraws) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  constexpr int64_t kVocab = 1000;
  std::vector<int32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(7 * i % kVocab);
  // Draws with an undrawable row (-1) and an id past the vocabulary.
  std::vector<int32_t> drawn(200);
  for (size_t r = 0; r < drawn.size(); ++r) drawn[r] = static_cast<int32_t>(3 + 11 * r % 900);
  drawn[5] = -1;
  drawn[9] = static_cast<int32_t>(kVocab + 3);
  // More pairs than one block of threads, rows in any order.
  std::vector<int32_t> pairs;
  for (int32_t i = 0; i < 150; ++i) pairs.insert(pairs.end(), {2 * i, (199 - i) % 200});
  pairs.insert(pairs.end(), {1, 5, 3, 9});
  std::vector<int32_t> want = tokens;
  for (size_t p = 0; p < pairs.size(); p += 2) {
    const int32_t id = drawn[pairs[p + 1]];
    want[pairs[p]] = id >= 0 && id < kVocab ? id : 0;
  }
  DeviceBuffer d_tokens = Upload(tokens), d_drawn = Upload(drawn), d_pairs = Upload(pairs);
  ASSERT_TRUE(PatchTokensFromPrevious(d_tokens.as<int32_t>(), d_drawn.as<int32_t>(),
                                      d_pairs.as<int32_t>(), static_cast<int64_t>(pairs.size() / 2),
                                      kVocab, nullptr)
                  .ok());
  const std::vector<int32_t> got = Download<int32_t>(d_tokens, tokens.size());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[1], 0);  // -1 became a valid id
  EXPECT_EQ(got[3], 0);  // so did the id past the vocabulary
  EXPECT_EQ(got[0], drawn[199]);
  EXPECT_EQ(got[299], tokens[299]);  // untouched
  // No pairs: nothing runs, nothing changes.
  ASSERT_TRUE(PatchTokensFromPrevious(d_tokens.as<int32_t>(), d_drawn.as<int32_t>(),
                                      d_pairs.as<int32_t>(), 0, kVocab, nullptr)
                  .ok());
  EXPECT_EQ(Download<int32_t>(d_tokens, tokens.size()), want);
}

TEST(PatchTokensValidation, RefusesBadArguments) {
  int32_t dummy = 0;
  EXPECT_EQ(PatchTokensFromPrevious(&dummy, &dummy, &dummy, -1, 10, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PatchTokensFromPrevious(&dummy, &dummy, &dummy, 1, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PatchTokensFromPrevious(nullptr, &dummy, &dummy, 1, 10, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PatchTokensFromPrevious(&dummy, nullptr, &dummy, 1, 10, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PatchTokensFromPrevious(&dummy, &dummy, nullptr, 1, 10, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Two copies queued behind a slow one: each buffer keeps its bytes until
// its own copy ran, and the third Next() hands out the first buffer again
// (after its copy completed).
TEST(PinnedStagingTest, AlternatesBuffersAndEveryCopyLandsWhole) {
  TESSERA_REQUIRE_CUDA_DEVICE();
  constexpr size_t kBytes = 1 << 20;
  absl::StatusOr<PinnedStaging> staging = PinnedStaging::Create(kBytes);
  ASSERT_TRUE(staging.ok()) << staging.status();
  absl::StatusOr<Stream> stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(kBytes),
                               b = DeviceBuffer::Allocate(kBytes),
                               c = DeviceBuffer::Allocate(kBytes);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<std::byte*> handed;
  for (DeviceBuffer* dst : {&*a, &*b, &*c}) {
    absl::StatusOr<std::byte*> host = staging->Next();
    ASSERT_TRUE(host.ok()) << host.status();
    handed.push_back(*host);
    std::memset(*host, static_cast<int>(handed.size()), kBytes);
    ASSERT_TRUE(staging->CopyToDevice(dst->data(), kBytes, stream->get()).ok());
  }
  EXPECT_NE(handed[0], handed[1]);
  EXPECT_EQ(handed[0], handed[2]);
  ASSERT_TRUE(Synchronize(stream->get()).ok());
  int fill = 1;
  for (DeviceBuffer* dst : {&*a, &*b, &*c}) {
    const std::vector<uint8_t> got = Download<uint8_t>(*dst, kBytes);
    EXPECT_EQ(got, std::vector<uint8_t>(kBytes, static_cast<uint8_t>(fill))) << "copy " << fill;
    ++fill;
  }
  // Misuse is an error, not a crash.
  EXPECT_EQ(staging->CopyToDevice(a->data(), 16, stream->get()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(staging->Next().ok());
  EXPECT_EQ(staging->CopyToDevice(a->data(), kBytes + 1, stream->get()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PinnedStagingValidation, EmptyStagingIsAnError) {
  PinnedStaging empty;
  EXPECT_EQ(empty.Next().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(empty.CopyToDevice(nullptr, 0, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera::kernels::cuda
