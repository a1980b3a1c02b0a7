// The model-free draft sources: n-gram prompt lookup and the suffix
// automaton (draft_source.h). Both propose one-hot drafts from token ids
// only (chains, or with TreeOptions token trees built by BuildDraftTree) and
// keep no run-ahead state: a proposal does not change the sequence, only
// Update does.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "worker/spec/draft_source.h"
#include "worker/spec/draft_tree.h"

namespace tessera::spec {
namespace {

// The token lists of open sequences, shared by both sources.
class TokenTable {
 public:
  absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens) {
    if (tokens.empty()) return absl::InvalidArgumentError("a draft sequence needs tokens");
    if (seqs_.contains(seq)) {
      return absl::AlreadyExistsError(absl::StrCat("draft sequence ", seq, " is already open"));
    }
    seqs_[seq].assign(tokens.begin(), tokens.end());
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<TokenId>*> Update(SeqKey seq, int64_t base_len,
                                               absl::Span<const TokenId> tokens) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no draft sequence ", seq));
    std::vector<TokenId>& t = it->second;
    if (base_len < 0 || base_len > static_cast<int64_t>(t.size())) {
      return absl::InvalidArgumentError(absl::StrCat("base_len ", base_len, " for sequence ", seq,
                                                     " outside [0, ", t.size(), "]"));
    }
    t.resize(base_len);
    t.insert(t.end(), tokens.begin(), tokens.end());
    return &t;
  }
  const std::vector<TokenId>* Find(SeqKey seq) const {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  // DraftSource::Length: -1 for an unknown sequence.
  int64_t Length(SeqKey seq) const {
    const std::vector<TokenId>* t = Find(seq);
    return t ? static_cast<int64_t>(t->size()) : -1;
  }
  std::vector<TokenId> Take(SeqKey seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return {};
    std::vector<TokenId> t = std::move(it->second);
    seqs_.erase(it);
    return t;
  }

 private:
  absl::flat_hash_map<SeqKey, std::vector<TokenId>> seqs_;
};

// ---- n-gram ----

class NgramSource final : public DraftSource {
 public:
  explicit NgramSource(NgramOptions o) : o_(o) {
    o_.min_ngram = std::max(1, o_.min_ngram);
    o_.max_ngram = std::max(o_.min_ngram, o_.max_ngram);
  }
  std::string name() const override { return "ngram"; }
  absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens,
                    const sampling::SamplingParams&) override {
    return table_.Open(seq, tokens);
  }
  absl::Status Update(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens) override {
    return table_.Update(seq, base_len, tokens).status();
  }
  void Close(SeqKey seq) override { table_.Take(seq); }
  int64_t Length(SeqKey seq) const override { return table_.Length(seq); }

  std::vector<Draft> Propose(absl::Span<const DraftQuery> queries) override {
    std::vector<Draft> out(queries.size());
    for (size_t i = 0; i < queries.size(); ++i) {
      const std::vector<TokenId>* t = table_.Find(queries[i].seq);
      if (t == nullptr) continue;
      out[i].base_len = static_cast<int64_t>(t->size());
      if (o_.tree.enabled()) {
        Draft d = BuildDraftTree(Occurrences(*t, queries[i].max_tokens), queries[i].max_tokens,
                                 o_.tree.max_branching);
        out[i].tokens = std::move(d.tokens);
        out[i].parents = std::move(d.parents);
      } else {
        out[i].tokens = Lookup(*t, queries[i].max_tokens);
      }
    }
    return out;
  }

 private:
  // Trees: what followed up to max_occurrences earlier occurrences of the
  // sequence's last n tokens, n from the longest that matches down to
  // min_ngram, latest first; a shorter n or an older occurrence weighs less.
  std::vector<Continuation> Occurrences(const std::vector<TokenId>& t, int k) const {
    std::vector<Continuation> out;
    const int n_tokens = static_cast<int>(t.size());
    if (k <= 0) return out;
    std::vector<int> used;  // continuation starts already taken
    int longest = 0;
    for (int n = std::min(o_.max_ngram, n_tokens - 1); n >= o_.min_ngram; --n) {
      const TokenId* suffix = t.data() + n_tokens - n;
      int rank = 0;
      for (int s = n_tokens - n - 1; s >= 0; --s) {
        if (static_cast<int>(out.size()) >= o_.max_occurrences) return out;
        if (!std::equal(suffix, suffix + n, t.data() + s)) continue;
        const int from = s + n;
        if (std::find(used.begin(), used.end(), from) != used.end()) continue;
        used.push_back(from);
        if (longest == 0) longest = n;
        Continuation c;
        const int count = std::min(k, n_tokens - from);
        c.tokens.assign(t.begin() + from, t.begin() + from + count);
        c.weight = std::pow(0.5, longest - n) * std::pow(0.8, rank++);
        out.push_back(std::move(c));
      }
    }
    return out;
  }

  std::vector<TokenId> Lookup(const std::vector<TokenId>& t, int k) const {
    const int n_tokens = static_cast<int>(t.size());
    if (k <= 0) return {};
    for (int n = std::min(o_.max_ngram, n_tokens - 1); n >= o_.min_ngram; --n) {
      // Latest start s < n_tokens - n with t[s, s+n) == the last n tokens.
      const TokenId* suffix = t.data() + n_tokens - n;
      for (int s = n_tokens - n - 1; s >= 0; --s) {
        if (!std::equal(suffix, suffix + n, t.data() + s)) continue;
        const int from = s + n;
        const int count = std::min(k, n_tokens - from);
        return std::vector<TokenId>(t.begin() + from, t.begin() + from + count);
      }
    }
    return {};
  }

  NgramOptions o_;
  TokenTable table_;
};

// ---- suffix automaton ----

// A suffix automaton (the minimal DFA of all suffixes) built online. Each
// state keeps `first_end`, the end position of its first occurrence, so a
// match can be continued with the tokens that followed it.
//
// With `track_latest` > 0 each state also keeps the end of its latest
// occurrence and of the one before it (last_end, prev_end), updated along
// the first `track_latest` suffix links from each new state (a state deeper
// in the chain keeps an older, still valid, occurrence).
class SuffixAutomaton {
 public:
  explicit SuffixAutomaton(int track_latest = 0) : track_latest_(track_latest) { Clear(); }

  void Clear() {
    states_.assign(1, State{});
    text_.clear();
    last_ = 0;
  }
  const std::vector<TokenId>& text() const { return text_; }

  void Extend(TokenId c) {
    const int pos = static_cast<int>(text_.size());
    text_.push_back(c);
    const int cur = NewState(states_[last_].len + 1, pos);
    int p = last_;
    while (p != -1 && !states_[p].next.contains(c)) {
      states_[p].next[c] = cur;
      p = states_[p].link;
    }
    if (p == -1) {
      states_[cur].link = 0;
    } else {
      const int q = states_[p].next[c];
      if (states_[p].len + 1 == states_[q].len) {
        states_[cur].link = q;
      } else {
        const int clone = NewState(states_[p].len + 1, states_[q].first_end);
        states_[clone].next = states_[q].next;
        states_[clone].link = states_[q].link;
        states_[clone].last_end = states_[q].last_end;
        states_[clone].prev_end = states_[q].prev_end;
        while (p != -1) {
          auto it = states_[p].next.find(c);
          if (it == states_[p].next.end() || it->second != q) break;
          it->second = clone;
          p = states_[p].link;
        }
        states_[q].link = clone;
        states_[cur].link = clone;
      }
    }
    last_ = cur;
    int s = cur;
    for (int i = 0; i < track_latest_ && s > 0; ++i, s = states_[s].link) {
      if (states_[s].last_end == pos) continue;
      states_[s].prev_end = states_[s].last_end;
      states_[s].last_end = pos;
    }
  }

  // With track_latest >= 2: the end of the latest earlier occurrence of the
  // longest repeated suffix, or -1.
  int LatestEarlierEnd() const {
    const int s = states_[last_].link;
    return s <= 0 ? -1 : states_[s].prev_end;
  }

  // The longest suffix of the whole text that also ends earlier: (length,
  // end of that earlier occurrence), or length 0.
  std::pair<int, int> LongestRepeatedSuffix() const {
    const int s = states_[last_].link;
    if (s <= 0) return {0, -1};
    return {states_[s].len, states_[s].first_end};
  }

  // The longest suffix of `window` occurring in the text: (length, end);
  // `latest` (optional) gets the end of its latest known occurrence.
  std::pair<int, int> Match(absl::Span<const TokenId> window, int* latest = nullptr) const {
    int state = 0, len = 0;
    for (TokenId c : window) {
      while (state != 0 && !states_[state].next.contains(c)) {
        state = states_[state].link;
        len = states_[state].len;
      }
      auto it = states_[state].next.find(c);
      if (it != states_[state].next.end()) {
        state = it->second;
        ++len;
      }
    }
    if (len == 0) return {0, -1};
    if (latest != nullptr) *latest = states_[state].last_end;
    return {len, states_[state].first_end};
  }

 private:
  struct State {
    int len = 0;
    int link = -1;
    int first_end = -1;
    int last_end = -1;
    int prev_end = -1;
    absl::flat_hash_map<TokenId, int> next;
  };
  int NewState(int len, int first_end) {
    states_.push_back(State{len, -1, first_end, -1, -1, {}});
    return static_cast<int>(states_.size()) - 1;
  }

  std::vector<State> states_;
  std::vector<TokenId> text_;
  int last_ = 0;
  int track_latest_ = 0;
};

constexpr TokenId kSeparator = -1;  // between sequences in the shared history

class SuffixSource final : public DraftSource {
 public:
  explicit SuffixSource(SuffixOptions o)
      : o_(o), track_(o.tree.enabled() ? kTrackLatest : 0), history_(track_) {}
  std::string name() const override { return "suffix"; }

  absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens,
                    const sampling::SamplingParams&) override {
    if (absl::Status s = table_.Open(seq, tokens); !s.ok()) return s;
    SuffixAutomaton& a = own_.try_emplace(seq, track_).first->second;
    for (TokenId t : tokens) a.Extend(t);
    return absl::OkStatus();
  }

  absl::Status Update(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens) override {
    auto t = table_.Update(seq, base_len, tokens);
    if (!t.ok()) return t.status();
    SuffixAutomaton& a = own_.try_emplace(seq, track_).first->second;
    const std::vector<TokenId>& now = **t;
    // Committed tokens only grow; rebuild in the rare other case.
    size_t common = 0;
    const std::vector<TokenId>& indexed = a.text();
    while (common < indexed.size() && common < now.size() && indexed[common] == now[common]) {
      ++common;
    }
    if (common < indexed.size()) {
      a.Clear();
      common = 0;
    }
    for (size_t i = common; i < now.size(); ++i) a.Extend(now[i]);
    return absl::OkStatus();
  }

  void Close(SeqKey seq) override {
    std::vector<TokenId> t = table_.Take(seq);
    own_.erase(seq);
    if (t.empty()) return;
    if (static_cast<int64_t>(history_.text().size() + t.size()) > o_.max_history_tokens) {
      // Keep the newer half of the history.
      const std::vector<TokenId> old = history_.text();
      history_.Clear();
      for (size_t i = old.size() / 2; i < old.size(); ++i) history_.Extend(old[i]);
    }
    if (static_cast<int64_t>(t.size()) > o_.max_history_tokens) return;
    for (TokenId x : t) history_.Extend(x);
    history_.Extend(kSeparator);
  }

  int64_t Length(SeqKey seq) const override { return table_.Length(seq); }

  std::vector<Draft> Propose(absl::Span<const DraftQuery> queries) override {
    std::vector<Draft> out(queries.size());
    for (size_t i = 0; i < queries.size(); ++i) {
      const std::vector<TokenId>* t = table_.Find(queries[i].seq);
      if (t == nullptr) continue;
      out[i].base_len = static_cast<int64_t>(t->size());
      const int k = queries[i].max_tokens;
      if (k <= 0) continue;
      const SuffixAutomaton& a = own_.try_emplace(queries[i].seq, track_).first->second;
      auto [own_len, own_end] = a.LongestRepeatedSuffix();
      const size_t window = std::min<size_t>(t->size(), o_.max_history_window);
      int hist_latest = -1;
      auto [hist_len, hist_end] =
          history_.Match(absl::MakeConstSpan(*t).subspan(t->size() - window), &hist_latest);
      if (hist_len < o_.min_history_match) hist_len = 0;
      if (own_len == 0 && hist_len == 0) continue;
      if (o_.tree.enabled()) {
        // The first and the latest earlier occurrence in the sequence and in
        // the history, the one the chain would take first.
        std::vector<Continuation> c;
        auto add = [&](const std::vector<TokenId>& text, int end, int len) {
          if (end < 0 || len == 0) return;
          Continuation x;
          x.weight = len;
          for (int j = end + 1; j < static_cast<int>(text.size()) && j <= end + k; ++j) {
            if (text[j] == kSeparator) break;
            x.tokens.push_back(text[j]);
          }
          c.push_back(std::move(x));
        };
        const int own_latest = a.LatestEarlierEnd();
        if (own_len >= hist_len) {
          add(*t, own_end, own_len);
          if (own_latest != own_end) add(*t, own_latest, own_len);
          add(history_.text(), hist_end, hist_len);
          if (hist_latest != hist_end) add(history_.text(), hist_latest, hist_len);
        } else {
          add(history_.text(), hist_end, hist_len);
          if (hist_latest != hist_end) add(history_.text(), hist_latest, hist_len);
          add(*t, own_end, own_len);
          if (own_latest != own_end) add(*t, own_latest, own_len);
        }
        Draft d = BuildDraftTree(c, k, o_.tree.max_branching);
        out[i].tokens = std::move(d.tokens);
        out[i].parents = std::move(d.parents);
        continue;
      }
      const std::vector<TokenId>& text = own_len >= hist_len ? *t : history_.text();
      const int end = own_len >= hist_len ? own_end : hist_end;
      for (int j = end + 1; j < static_cast<int>(text.size()) && j <= end + k; ++j) {
        if (text[j] == kSeparator) break;
        out[i].tokens.push_back(text[j]);
      }
    }
    return out;
  }

 private:
  static constexpr int kTrackLatest = 32;  // suffix links updated per token (trees)

  SuffixOptions o_;
  int track_;
  TokenTable table_;
  absl::flat_hash_map<SeqKey, SuffixAutomaton> own_;
  SuffixAutomaton history_;
};

}  // namespace

std::unique_ptr<DraftSource> MakeNgramSource(NgramOptions options) {
  return std::make_unique<NgramSource>(options);
}

std::unique_ptr<DraftSource> MakeSuffixSource(SuffixOptions options) {
  return std::make_unique<SuffixSource>(options);
}

}  // namespace tessera::spec
