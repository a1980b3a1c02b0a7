// Building token trees for the draft sources: weighted candidate
// continuations of one sequence merged into a trie, then cut best first to
// a node budget and a branching bound (draft_source.h, TreeOptions).
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include "worker/spec/draft_source.h"

namespace tessera::spec {

struct Continuation {
  std::vector<TokenId> tokens;  // what followed an earlier occurrence
  double weight = 1;            // how much it is trusted (> 0)
};

// The trie of `candidates` (earlier entries win ties), cut to at most
// `max_nodes` nodes with at most `max_branching` children per node. A node's
// score is the share of the candidates' weight that passes through it, times
// `depth_decay`^(depth - 1); nodes are chosen best first, each after its
// parent, and listed in the order chosen, so parents[i] < i and a node's
// first child is its best one. Returns tokens and parents (parents empty when
// the result is a chain); base_len and q are left to the caller.
Draft BuildDraftTree(const std::vector<Continuation>& candidates, int max_nodes, int max_branching,
                     double depth_decay = 0.75);

}  // namespace tessera::spec
