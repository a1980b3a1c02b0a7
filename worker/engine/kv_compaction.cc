#include "worker/engine/kv_compaction.h"

namespace tessera::engine {

KvSlotCopies AcceptedPathCopies(absl::Span<const int64_t> node_slots,
                                absl::Span<const int32_t> path) {
  KvSlotCopies copies;
  for (size_t m = 0; m < path.size(); ++m) {
    if (path[m] == static_cast<int32_t>(m)) continue;
    copies.from.push_back(node_slots[path[m]]);
    copies.to.push_back(node_slots[m]);
  }
  return copies;
}

}  // namespace tessera::engine
