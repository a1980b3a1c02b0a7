// DraftKvCache: the block bookkeeping of a draft model's paged KV cache
// (model_source.h). A pool of fixed-size blocks and, per draft sequence, its
// block table and the number of KV slots it holds (slot = block * block_size
// + offset, the layout runner::ForwardBatch expects). It never touches KV
// memory: the draft model's runner writes K/V to the slots.
//
// Simpler than the target's engine::BlockManager on purpose: a draft
// sequence owns its blocks alone (no prefix cache, no sharing, no events),
// so growing takes free blocks and shrinking returns them, and nothing is
// ever copied.
//
// Thread-safety: not thread-safe; one draft source owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/spec/draft_source.h"

namespace tessera::spec {

class DraftKvCache {
 public:
  // INVALID_ARGUMENT unless block_size and num_blocks are positive.
  static absl::StatusOr<std::unique_ptr<DraftKvCache>> Create(int block_size, int64_t num_blocks);

  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }

  // Adds n slots at the end of `seq` (starting it when unknown). False, with
  // nothing changed, when the pool has too few free blocks.
  bool Append(SeqKey seq, int n);
  // Keeps the first `keep` slots of `seq`, returning blocks no longer
  // needed. REQUIRES: 0 <= keep.
  void Truncate(SeqKey seq, int keep);
  // Returns every block of `seq`; unknown sequences are ignored.
  void Free(SeqKey seq);

  bool Contains(SeqKey seq) const { return seqs_.contains(seq); }
  // 0 for an unknown sequence.
  int NumSlots(SeqKey seq) const;
  // Empty for an unknown sequence.
  absl::Span<const int32_t> BlockTable(SeqKey seq) const;

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int num_slots = 0;
  };
  DraftKvCache(int block_size, int64_t num_blocks);
  size_t BlocksFor(int slots) const { return (slots + block_size_ - 1) / block_size_; }

  const int block_size_;
  std::vector<int32_t> free_;  // a stack: the lowest ids are taken first
  absl::flat_hash_map<SeqKey, Table> seqs_;
};

}  // namespace tessera::spec
