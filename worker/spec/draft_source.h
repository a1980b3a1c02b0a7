// DraftSource: where speculative tokens come from. One interface for the
// model-free sources (n-gram prompt lookup, suffix automaton) and the draft
// model, used by the drafter service and by the worker's in-process mode.
//
// A source mirrors each open sequence's tokens. Propose() continues them and,
// for sources with state (the draft model's KV cache), runs ahead: the
// proposed tokens are kept as if they were accepted, so a Commit that agrees
// costs nothing and one that disagrees truncates to the common prefix
// (Update). A proposal is a chain (parents empty: token i hangs off token
// i-1) or, with TreeOptions::max_branching > 1, a token tree: several
// candidates for one position, each node listing its parent.
//
// Thread-safety: not thread-safe; one owner (an engine loop or one drafter
// stream) calls every method.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sampling/sampling_params.h"

namespace tessera::spec {

using TokenId = int32_t;
using SeqKey = uint64_t;

// The distribution a draft token was drawn from, sparse: `tokens` with
// `probs` (summing to 1; tokens not listed have probability 0). A draft
// whose `q` is empty is one-hot on its token (greedy and model-free drafts).
struct DraftDistribution {
  std::vector<TokenId> tokens;
  std::vector<float> probs;
};

// A proposed continuation of a sequence of length base_len.
struct Draft {
  int64_t base_len = 0;
  std::vector<TokenId> tokens;
  // parents[i] = index of token i's parent (< i), -1 = the last committed
  // token. Empty = a chain. Node i sits at depth(i) = 1 + depth(parent)
  // (depth(-1) = 0): it proposes the token at base_len - 1 + depth(i).
  std::vector<int32_t> parents;
  // Empty = one-hot; otherwise one entry per token.
  std::vector<DraftDistribution> q;
};

struct DraftQuery {
  SeqKey seq = 0;
  int max_tokens = 0;  // upper bound on the proposal's length
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::string name() const = 0;

  // Starts a sequence with its tokens so far (prompt + output).
  // ALREADY_EXISTS for an open id, INVALID_ARGUMENT for empty tokens.
  virtual absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens,
                            const sampling::SamplingParams& params) = 0;
  // The sequence becomes its first base_len tokens followed by `tokens`.
  // NOT_FOUND for an unknown id; INVALID_ARGUMENT when base_len exceeds
  // what the source holds (committed plus run-ahead tokens).
  virtual absl::Status Update(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens) = 0;
  // Forgets a sequence (unknown ids are ignored).
  virtual void Close(SeqKey seq) = 0;
  // One draft per query, in order, continuing each sequence's current
  // tokens (base_len = their count). A draft may be empty (nothing to
  // propose, unknown id). Sources with state keep the drafted tokens as if
  // accepted.
  virtual std::vector<Draft> Propose(absl::Span<const DraftQuery> queries) = 0;
  // Tokens the source holds for `seq` (committed plus run-ahead); -1 when
  // unknown.
  virtual int64_t Length(SeqKey seq) const = 0;
  // True when Propose keeps the proposed tokens (the next Propose continues
  // after them); false when proposals leave the sequence unchanged.
  virtual bool runs_ahead() const { return false; }
};

// Token trees. max_branching <= 1: chains (the default). Otherwise a node
// has at most max_branching children; a proposal has at most the queried
// max_tokens nodes; the first child of every node (the lowest index) is the
// source's best guess, so the first-child chain is what a chain-only
// verifier keeps (FirstChildChain).
struct TreeOptions {
  int max_branching = 1;
  // The draft model: positions (from the first) that get siblings, the next
  // most likely tokens of the draft's distribution, as leaves.
  int branch_depth = 1;
  bool enabled() const { return max_branching > 1; }
};

// True when `d` is a chain (parents empty or parents[i] == i - 1).
bool IsChain(const Draft& d);
// The chain from the root following each node's first child; q kept per
// node. A chain is returned unchanged.
Draft FirstChildChain(const Draft& d);
// The nodes below `node` (its descendants, in order), re-rooted: node's
// children hang off the last committed token; base_len + depth(node).
// REQUIRES: d is well formed (ValidateDraft) and node < d.tokens.size().
Draft SubtreeBelow(const Draft& d, int node);

// Options of the model-free sources.
struct NgramOptions {
  int min_ngram = 1;  // shortest suffix looked up
  int max_ngram = 4;  // longest suffix looked up (tried first)
  // Trees: the continuations of up to max_occurrences earlier occurrences
  // (the longest matching n first, latest first, then shorter n) merged
  // into a trie and cut best first to the budget.
  TreeOptions tree;
  int max_occurrences = 8;
};

struct SuffixOptions {
  // Recent finished sequences kept for lookups across requests, in tokens.
  int64_t max_history_tokens = 1 << 18;
  // Shortest match in the shared history that is trusted (the sequence's
  // own tokens need 1).
  int min_history_match = 2;
  // Longest suffix of a sequence matched against the shared history.
  int max_history_window = 64;
  // Trees: the continuations of the first and the latest earlier occurrence
  // of the match in the sequence and in the history, merged into a trie.
  TreeOptions tree;
};

// Prompt lookup: the latest earlier occurrence of the sequence's last n
// tokens (n from max_ngram down to min_ngram) and what followed it.
std::unique_ptr<DraftSource> MakeNgramSource(NgramOptions options = {});

// A suffix automaton over each sequence's tokens plus one over recently
// finished sequences: the longest suffix of the sequence found in either and
// the tokens that followed its occurrence.
std::unique_ptr<DraftSource> MakeSuffixSource(SuffixOptions options = {});

}  // namespace tessera::spec
