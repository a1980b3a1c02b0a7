#include "base/block_hash.h"

#include <dlfcn.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

uint64_t HashString(const std::string& s, uint64_t seed) {
  return XxHash64(s.data(), s.size(), seed);
}

// Published XXH64 test values (the reference implementation's).
TEST(XxHash64Test, MatchesReferenceValues) {
  EXPECT_EQ(HashString("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(HashString("", 1), 0xD5AFBA1336A3BE4BULL);
  EXPECT_EQ(HashString("a", 0), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(HashString("abc", 0), 0x44BC2CF5AD770999ULL);
  // 39 bytes: one 32-byte stripe plus an 8-, a 4-... byte tail.
  EXPECT_EQ(HashString("Nobody inspects the spammish repetition", 0), 0xFBCEA83C8A378BF1ULL);
}

// When the system's libxxhash is present, agree with it on every length
// class (stripes, 8/4/1-byte tails) and several seeds.
TEST(XxHash64Test, AgreesWithSystemLibrary) {
  void* lib = dlopen("libxxhash.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) GTEST_SKIP() << "libxxhash.so.0 not installed";
  using Fn = uint64_t (*)(const void*, size_t, uint64_t);
  auto ref = reinterpret_cast<Fn>(dlsym(lib, "XXH64"));
  ASSERT_NE(ref, nullptr);
  std::mt19937_64 rng(7);
  for (size_t n = 0; n < 300; ++n) {
    std::vector<unsigned char> buf(n);
    for (auto& b : buf) b = static_cast<unsigned char>(rng());
    const uint64_t seed = n % 3 == 0 ? 0 : rng();
    EXPECT_EQ(XxHash64(buf.data(), n, seed), ref(buf.data(), n, seed)) << "n=" << n;
  }
  dlclose(lib);
}

// The wire layout other processes must reproduce: LE64 parent, LE32 tokens.
TEST(BlockHashTest, HashesParentThenTokensLittleEndian) {
  const std::vector<TokenId> tokens = {1, 258, -1, 70000};
  const uint64_t parent = 0x0102030405060708ULL;
  const unsigned char bytes[] = {
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // parent
      0x01, 0x00, 0x00, 0x00,                          // 1
      0x02, 0x01, 0x00, 0x00,                          // 258
      0xFF, 0xFF, 0xFF, 0xFF,                          // -1
      0x70, 0x11, 0x01, 0x00,                          // 70000
  };
  EXPECT_EQ(HashBlockTokens(parent, tokens, 5), XxHash64(bytes, sizeof(bytes), 5));
}

TEST(BlockHashTest, DependsOnParentTokensAndSeed) {
  std::vector<TokenId> block(16);
  for (int i = 0; i < 16; ++i) block[i] = 100 + i;
  const uint64_t h = HashBlockTokens(kRootParentHash, block, 0);
  EXPECT_EQ(h, HashBlockTokens(kRootParentHash, block, 0));
  EXPECT_NE(h, HashBlockTokens(h, block, 0));
  EXPECT_NE(h, HashBlockTokens(kRootParentHash, block, 1));
  std::vector<TokenId> other = block;
  other[15] += 1;
  EXPECT_NE(h, HashBlockTokens(kRootParentHash, other, 0));
}

// Large blocks take the heap path; they must hash like the stack path would.
TEST(BlockHashTest, LargeBlocksHashTheSameLayout) {
  std::vector<TokenId> block(300);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<TokenId>(i * 7);
  std::vector<unsigned char> bytes(8 + 4 * block.size(), 0);
  for (size_t i = 0; i < block.size(); ++i) {
    uint32_t v = static_cast<uint32_t>(block[i]);
    for (int k = 0; k < 4; ++k) bytes[8 + 4 * i + k] = static_cast<unsigned char>(v >> (8 * k));
  }
  EXPECT_EQ(HashBlockTokens(kRootParentHash, block, 0), XxHash64(bytes.data(), bytes.size(), 0));
}

TEST(BlockHashTest, FullBlocksChainAndSkipThePartialTail) {
  std::vector<TokenId> tokens(37);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i);
  std::vector<uint64_t> hashes;
  HashFullBlocks(tokens, 16, 3, &hashes);
  ASSERT_EQ(hashes.size(), 2u);
  const auto span = absl::MakeConstSpan(tokens);
  EXPECT_EQ(hashes[0], HashBlockTokens(kRootParentHash, span.subspan(0, 16), 3));
  EXPECT_EQ(hashes[1], HashBlockTokens(hashes[0], span.subspan(16, 16), 3));

  // The same second block after a different first block hashes differently.
  std::vector<TokenId> other = tokens;
  other[0] = 999;
  std::vector<uint64_t> other_hashes;
  HashFullBlocks(other, 16, 3, &other_hashes);
  ASSERT_EQ(other_hashes.size(), 2u);
  EXPECT_NE(other_hashes[0], hashes[0]);
  EXPECT_NE(other_hashes[1], hashes[1]);
}

}  // namespace
}  // namespace tessera
