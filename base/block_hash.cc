#include "base/block_hash.h"

#include <vector>

namespace tessera {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

uint64_t RotateLeft(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Reads little-endian integers byte by byte: correct on any host order and
// alignment.
uint64_t ReadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t ReadLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

void WriteLe64(uint64_t v, unsigned char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

void WriteLe32(uint32_t v, unsigned char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t Round(uint64_t acc, uint64_t lane) {
  acc += lane * kPrime2;
  acc = RotateLeft(acc, 31);
  return acc * kPrime1;
}

uint64_t MergeRound(uint64_t acc, uint64_t lane) {
  acc ^= Round(0, lane);
  return acc * kPrime1 + kPrime4;
}

}  // namespace

uint64_t XxHash64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = seed + kPrime1 + kPrime2;
    uint64_t v2 = seed + kPrime2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kPrime1;
    const unsigned char* const last_stripe = end - 32;
    do {
      v1 = Round(v1, ReadLe64(p));
      v2 = Round(v2, ReadLe64(p + 8));
      v3 = Round(v3, ReadLe64(p + 16));
      v4 = Round(v4, ReadLe64(p + 24));
      p += 32;
    } while (p <= last_stripe);
    h = RotateLeft(v1, 1) + RotateLeft(v2, 7) + RotateLeft(v3, 12) + RotateLeft(v4, 18);
    h = MergeRound(h, v1);
    h = MergeRound(h, v2);
    h = MergeRound(h, v3);
    h = MergeRound(h, v4);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(size);
  while (end - p >= 8) {
    h ^= Round(0, ReadLe64(p));
    h = RotateLeft(h, 27) * kPrime1 + kPrime4;
    p += 8;
  }
  if (end - p >= 4) {
    h ^= static_cast<uint64_t>(ReadLe32(p)) * kPrime1;
    h = RotateLeft(h, 23) * kPrime2 + kPrime3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kPrime5;
    h = RotateLeft(h, 11) * kPrime1;
    ++p;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

uint64_t HashBlockTokens(uint64_t parent_hash, absl::Span<const TokenId> tokens, uint64_t seed) {
  // Small blocks (the usual 16 tokens = 72 bytes) are serialized on the
  // stack; larger ones on the heap.
  constexpr size_t kStackBytes = 8 + 4 * 64;
  unsigned char stack_buf[kStackBytes];
  std::vector<unsigned char> heap_buf;
  const size_t size = 8 + 4 * tokens.size();
  unsigned char* buf = stack_buf;
  if (size > kStackBytes) {
    heap_buf.resize(size);
    buf = heap_buf.data();
  }
  WriteLe64(parent_hash, buf);
  for (size_t i = 0; i < tokens.size(); ++i) {
    WriteLe32(static_cast<uint32_t>(tokens[i]), buf + 8 + 4 * i);
  }
  return XxHash64(buf, size, seed);
}

void HashFullBlocks(absl::Span<const TokenId> tokens, int block_size, uint64_t seed,
                    std::vector<uint64_t>* hashes) {
  hashes->clear();
  uint64_t parent = kRootParentHash;
  for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    parent = HashBlockTokens(parent, tokens.subspan(start, block_size), seed);
    hashes->push_back(parent);
  }
}

}  // namespace tessera
