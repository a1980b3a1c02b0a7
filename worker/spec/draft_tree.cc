// Token-tree helpers (draft_source.h, draft_tree.h).
#include "worker/spec/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <tuple>

namespace tessera::spec {

bool IsChain(const Draft& d) {
  for (size_t i = 0; i < d.parents.size(); ++i) {
    if (d.parents[i] != static_cast<int32_t>(i) - 1) return false;
  }
  return true;
}

Draft FirstChildChain(const Draft& d) {
  if (IsChain(d)) return d;
  Draft out;
  out.base_len = d.base_len;
  int32_t at = -1;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    if (i >= d.parents.size() || d.parents[i] != at) continue;
    out.tokens.push_back(d.tokens[i]);
    if (!d.q.empty()) out.q.push_back(d.q[i]);
    at = static_cast<int32_t>(i);
  }
  return out;
}

Draft SubtreeBelow(const Draft& d, int node) {
  const size_t n = d.tokens.size();
  std::vector<int32_t> parents(n);
  for (size_t i = 0; i < n; ++i) {
    parents[i] = d.parents.empty() ? static_cast<int32_t>(i) - 1 : d.parents[i];
  }
  std::vector<int32_t> depth(n, 0), remap(n, -2);  // -2: not below `node`
  for (size_t i = 0; i < n; ++i) depth[i] = parents[i] < 0 ? 1 : depth[parents[i]] + 1;
  Draft out;
  out.base_len = d.base_len + depth[node];
  remap[node] = -1;
  bool chain = true;
  for (size_t i = node + 1; i < n; ++i) {
    const int32_t p = parents[i];
    if (p < 0 || remap[p] == -2) continue;
    remap[i] = static_cast<int32_t>(out.tokens.size());
    chain &= remap[p] == remap[i] - 1;
    out.tokens.push_back(d.tokens[i]);
    out.parents.push_back(remap[p]);
    if (!d.q.empty()) out.q.push_back(d.q[i]);
  }
  if (chain) out.parents.clear();
  return out;
}

Draft BuildDraftTree(const std::vector<Continuation>& candidates, int max_nodes, int max_branching,
                     double depth_decay) {
  struct TrieNode {
    TokenId token;
    int parent;  // trie index, -1 = root
    int depth;
    double weight = 0;
    int first_candidate;  // the earliest candidate through this node
    std::vector<int> children;
  };
  std::vector<TrieNode> trie;
  std::vector<int> root_children;
  double total = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const Continuation& cand = candidates[c];
    if (!(cand.weight > 0) || cand.tokens.empty()) continue;
    total += cand.weight;
    int at = -1;
    const size_t len = std::min<size_t>(cand.tokens.size(), std::max(0, max_nodes));
    for (size_t j = 0; j < len; ++j) {
      std::vector<int>& kids = at < 0 ? root_children : trie[at].children;
      int found = -1;
      for (int k : kids) {
        if (trie[k].token == cand.tokens[j]) found = k;
      }
      if (found < 0) {
        found = static_cast<int>(trie.size());
        const int depth = at < 0 ? 1 : trie[at].depth + 1;
        kids.push_back(found);  // before push_back into trie: `kids` may move
        trie.push_back(TrieNode{cand.tokens[j], at, depth, 0, static_cast<int>(c), {}});
      }
      trie[found].weight += cand.weight;
      at = found;
    }
  }
  Draft out;
  if (trie.empty() || max_nodes <= 0) return out;
  // Best first: (score, earliest candidate (lower wins), trie index).
  using Entry = std::tuple<double, int, int>;
  auto worse = [](const Entry& a, const Entry& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);
    return std::get<2>(a) > std::get<2>(b);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> frontier(worse);
  auto push = [&](int k) {
    const TrieNode& t = trie[k];
    frontier.push({t.weight / total * std::pow(depth_decay, t.depth - 1), t.first_candidate, k});
  };
  for (int k : root_children) push(k);
  std::vector<int> index(trie.size(), -1);  // trie node -> output index
  std::vector<int> chosen_children(trie.size(), 0);
  int root_chosen = 0;
  const int branching = std::max(1, max_branching);
  bool chain = true;
  while (!frontier.empty() && static_cast<int>(out.tokens.size()) < max_nodes) {
    const int k = std::get<2>(frontier.top());
    frontier.pop();
    const int p = trie[k].parent;
    int& siblings = p < 0 ? root_chosen : chosen_children[p];
    if (siblings >= branching) continue;
    ++siblings;
    index[k] = static_cast<int>(out.tokens.size());
    const int32_t parent = p < 0 ? -1 : index[p];
    chain &= parent == index[k] - 1;
    out.tokens.push_back(trie[k].token);
    out.parents.push_back(parent);
    for (int c : trie[k].children) push(c);
  }
  if (chain) out.parents.clear();
  return out;
}

}  // namespace tessera::spec
