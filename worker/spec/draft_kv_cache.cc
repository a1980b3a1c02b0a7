#include "worker/spec/draft_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::spec {

absl::StatusOr<std::unique_ptr<DraftKvCache>> DraftKvCache::Create(int block_size,
                                                                   int64_t num_blocks) {
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be positive, got ", block_size));
  }
  if (num_blocks <= 0 || num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_blocks must be in [1, 2^31), got ", num_blocks));
  }
  return std::unique_ptr<DraftKvCache>(new DraftKvCache(block_size, num_blocks));
}

DraftKvCache::DraftKvCache(int block_size, int64_t num_blocks) : block_size_(block_size) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool DraftKvCache::Append(SeqKey seq, int n) {
  if (n < 0) return false;
  Table& t = seqs_[seq];
  const size_t needed = BlocksFor(t.num_slots + n);
  if (needed > t.blocks.size() + free_.size()) {
    if (t.blocks.empty()) seqs_.erase(seq);  // as if never asked
    return false;
  }
  while (t.blocks.size() < needed) {
    t.blocks.push_back(free_.back());
    free_.pop_back();
  }
  t.num_slots += n;
  return true;
}

void DraftKvCache::Truncate(SeqKey seq, int keep) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Table& t = it->second;
  t.num_slots = std::clamp(keep, 0, t.num_slots);
  const size_t needed = BlocksFor(t.num_slots);
  while (t.blocks.size() > needed) {
    free_.push_back(t.blocks.back());
    t.blocks.pop_back();
  }
}

void DraftKvCache::Free(SeqKey seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first, so the stack hands the lowest ids out again first.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) free_.push_back(*b);
  seqs_.erase(it);
}

int DraftKvCache::NumSlots(SeqKey seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.num_slots;
}

absl::Span<const int32_t> DraftKvCache::BlockTable(SeqKey seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

}  // namespace tessera::spec
