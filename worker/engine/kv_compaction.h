// KV compaction after a token tree is verified. The tree's nodes were
// computed in the slots after the decode token, in node order; the accepted
// ones (a root-to-leaf path) must end up in path order right after the
// decode token, so that the sequence's KV is contiguous again and the
// scheduler rolls the rejected nodes back as for a chain (scheduler.h,
// SampledTokens::draft_path). This file says which slots move where; the
// model runner moves the K/V (runner::ModelRunner::CopyKvSlots).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tessera::engine {

// Slot copies, from[i] -> to[i], to perform in order.
struct KvSlotCopies {
  std::vector<int64_t> from;
  std::vector<int64_t> to;

  bool empty() const { return from.empty(); }
};

// `node_slots[i]` is the KV slot of draft node i; `path` the accepted nodes,
// increasing (so path[m] >= m). Node path[m] moves to the slot of node m;
// nodes already in place do not move. No copy overwrites the source of a
// later one, so the copies may run in order.
// REQUIRES: every path entry < node_slots.size().
KvSlotCopies AcceptedPathCopies(absl::Span<const int64_t> node_slots,
                                absl::Span<const int32_t> path);

}  // namespace tessera::engine
