#include "worker/engine/speculation.h"

#include <utility>
#include <vector>

#include "base/log.h"
#include "worker/spec/verifier.h"

namespace tessera::engine {

Speculation::Speculation(const spec::SpeculationOptions& options,
                         std::shared_ptr<spec::DraftProvider> provider)
    : options_(options), provider_(std::move(provider)) {}

void Speculation::Add(SequenceId id) { states_.emplace(id, State(options_)); }

void Speculation::Remove(SequenceId id) {
  auto it = states_.find(id);
  if (it == states_.end()) return;
  if (it->second.open && provider_ != nullptr) provider_->Close(id);
  states_.erase(it);
}

DraftTokens Speculation::CollectDrafts(const Scheduler& scheduler, int64_t vocab,
                                       bool tree_attention) {
  step_drafts_.clear();
  if (!enabled()) return {};
  const std::vector<SequenceId> decoding = scheduler.DecodingSequences();
  std::vector<spec::ProposalRequest> wanted;
  for (SequenceId id : decoding) {
    auto it = states_.find(id);
    const Sequence* seq = scheduler.FindSequence(id);
    if (it == states_.end() || seq == nullptr || !it->second.open) continue;
    const int k = it->second.length.Next(options_, static_cast<int>(decoding.size()));
    if (k > 0) wanted.push_back({id, seq->num_tokens(), k});
  }
  if (wanted.empty()) return {};
  std::vector<std::optional<spec::Draft>> got = provider_->GetDrafts(wanted);
  DraftTokens drafts;
  for (size_t i = 0; i < wanted.size() && i < got.size(); ++i) {
    if (!got[i] || got[i]->base_len != wanted[i].num_tokens) continue;
    spec::Draft& d = *got[i];
    if (static_cast<int>(d.tokens.size()) > wanted[i].max_tokens) {
      d.tokens.resize(wanted[i].max_tokens);
      if (!d.q.empty()) d.q.resize(wanted[i].max_tokens);
      if (!d.parents.empty()) d.parents.resize(wanted[i].max_tokens);
    }
    if (d.tokens.empty()) continue;
    if (absl::Status s = spec::ValidateDraft(d, vocab); !s.ok()) {
      LogDebug("draft dropped", {{"seq", wanted[i].seq}, {"why", std::string(s.message())}});
      continue;
    }
    // A runner without tree attention verifies the first-child chain.
    if (!tree_attention && !spec::IsChain(d)) d = spec::FirstChildChain(d);
    drafts[wanted[i].seq] = d.tokens;
    step_drafts_[wanted[i].seq] = std::move(d);
  }
  return drafts;
}

bool Speculation::IsTree(SequenceId id) const {
  auto it = step_drafts_.find(id);
  return it != step_drafts_.end() && !spec::IsChain(it->second);
}

void Speculation::LayOutTrees(const ScheduledBatch& batch, runner::ForwardBatch* f) const {
  bool any = false;
  for (const ScheduledSequence& s : batch.sequences) {
    any |= s.num_draft_tokens > 0 && IsTree(s.id);
  }
  if (!any) return;
  f->tree_parents.resize(f->token_ids.size());
  int begin = 0;
  for (const ScheduledSequence& s : batch.sequences) {
    for (int j = 0; j < s.num_tokens; ++j) f->tree_parents[begin + j] = j - 1;
    if (s.num_draft_tokens > 0 && IsTree(s.id)) {
      // The drafts follow the decode token: node i is chunk token first + i.
      const std::vector<int32_t>& parents = step_drafts_.at(s.id).parents;
      const int first = s.num_tokens - s.num_draft_tokens;
      std::vector<int32_t> depth(s.num_tokens);
      for (int j = 0; j < s.num_tokens; ++j) {
        if (j >= first) {
          const int32_t p = parents[j - first];
          f->tree_parents[begin + j] = p < 0 ? first - 1 : first + p;
        }
        const int32_t parent = f->tree_parents[begin + j];
        depth[j] = parent < 0 ? 0 : depth[parent] + 1;
        f->positions[begin + j] = s.start_position + depth[j];
      }
    }
    begin += s.num_tokens;
  }
}

void Speculation::Record(SequenceId id, int proposed, int accepted) {
  auto it = states_.find(id);
  if (it == states_.end()) return;
  it->second.counts.proposed += proposed;
  it->second.counts.accepted += accepted;
  it->second.length.Observe(options_, proposed, accepted);
}

Speculation::Counts Speculation::CountsOf(SequenceId id) const {
  auto it = states_.find(id);
  return it == states_.end() ? Counts{} : it->second.counts;
}

void Speculation::Commit(SequenceId id, const Sequence& seq, absl::Span<const TokenId> new_tokens,
                         const sampling::SamplingParams& params) {
  if (!enabled() || new_tokens.empty()) return;
  auto it = states_.find(id);
  if (it == states_.end()) return;
  const int max_k = options_.num_speculative_tokens;
  if (!it->second.open) {
    provider_->Open(id, seq.token_ids(), params, max_k);
    it->second.open = true;
  } else {
    const int64_t base = seq.num_tokens() - static_cast<int64_t>(new_tokens.size());
    provider_->Commit(id, base, new_tokens, max_k);
  }
}

}  // namespace tessera::engine
