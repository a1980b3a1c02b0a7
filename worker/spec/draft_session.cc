#include "worker/spec/draft_session.h"

#include <algorithm>

#include "base/log.h"

namespace tessera::spec {

DraftSession::DraftSession(DraftSource* source, int max_draft_tokens)
    : source_(*source), max_draft_tokens_(max_draft_tokens) {}

int DraftSession::Limit(SeqKey seq) const {
  auto it = limits_.find(seq);
  return it == limits_.end() ? 0 : std::clamp(it->second, 0, max_draft_tokens_);
}

void DraftSession::Drop(SeqKey seq) {
  source_.Close(seq);
  limits_.erase(seq);
}

void DraftSession::Open(SeqKey seq, const std::vector<TokenId>& tokens,
                        const sampling::SamplingParams& params, int max_draft_tokens) {
  ahead_.erase(seq);
  ready_.erase(seq);
  source_.Close(seq);  // a re-open replaces the sequence
  if (absl::Status s = source_.Open(seq, tokens, params); !s.ok()) {
    LogDebug("draft sequence dropped", {{"seq", seq}, {"why", std::string(s.message())}});
    return Drop(seq);
  }
  limits_[seq] = max_draft_tokens;
  changed_.push_back(seq);
}

void DraftSession::Commit(SeqKey seq, int64_t base_len, const std::vector<TokenId>& tokens,
                          int max_draft_tokens) {
  if (max_draft_tokens > 0 && limits_.contains(seq)) limits_[seq] = max_draft_tokens;
  ready_.erase(seq);
  if (auto a = ahead_.find(seq); a != ahead_.end()) {
    const bool hit = a->second.commit_base == base_len && a->second.expect == tokens;
    if (hit) {  // the source already holds these tokens and the next draft
      ++run_ahead_hits_;
      ready_[seq] = std::move(a->second.proposal);
      ahead_.erase(a);
      return;
    }
    ahead_.erase(a);
  }
  if (absl::Status s = source_.Update(seq, base_len, tokens); !s.ok()) {
    LogDebug("draft sequence dropped", {{"seq", seq}, {"why", std::string(s.message())}});
    return Drop(seq);
  }
  changed_.push_back(seq);
}

void DraftSession::Close(SeqKey seq) {
  ahead_.erase(seq);
  ready_.erase(seq);
  Drop(seq);
}

bool DraftSession::Round(const SendFn& send) {
  const Proposals proposals = TakeProposals();
  if (proposals.empty()) return true;
  if (!send(proposals)) return false;
  proposals_sent_ += static_cast<int64_t>(proposals.size());
  RunAhead(proposals);
  return true;
}

DraftSession::Proposals DraftSession::TakeProposals() {
  Proposals out;
  for (auto& [seq, d] : ready_) {
    if (!d.tokens.empty()) out.emplace_back(seq, std::move(d));
  }
  ready_.clear();
  std::sort(changed_.begin(), changed_.end());
  changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
  std::vector<DraftQuery> queries;
  for (SeqKey seq : changed_) {
    if (limits_.contains(seq)) queries.push_back({seq, Limit(seq)});
  }
  changed_.clear();
  if (queries.empty()) return out;
  std::vector<Draft> drafts = source_.Propose(queries);
  for (size_t i = 0; i < drafts.size() && i < queries.size(); ++i) {
    if (!drafts[i].tokens.empty()) out.emplace_back(queries[i].seq, std::move(drafts[i]));
  }
  return out;
}

void DraftSession::RunAhead(const Proposals& sent) {
  if (!source_.runs_ahead() || sent.empty()) return;
  // Draft the next proposal now: one guessed bonus token, then k more.
  std::vector<DraftQuery> next;
  for (const auto& [seq, d] : sent) next.push_back({seq, Limit(seq) + 1});
  std::vector<Draft> more = source_.Propose(next);
  for (size_t i = 0; i < sent.size() && i < more.size(); ++i) {
    const auto& [seq, d] = sent[i];
    Draft& m = more[i];
    if (m.tokens.size() < 2) continue;
    Ahead a;
    // A tree's "all accepted" is its first-child chain (what the source ran
    // ahead with); the next proposal is what hangs below the guessed bonus
    // token (node 0).
    a.commit_base = d.base_len;
    a.expect = FirstChildChain(d).tokens;
    a.expect.push_back(m.tokens[0]);
    a.proposal = SubtreeBelow(m, 0);
    if (a.proposal.tokens.empty()) continue;
    ahead_[seq] = std::move(a);
  }
}

}  // namespace tessera::spec
