// DraftSession: the drafter's state for one worker's Speculate stream, in
// plain C++ (the gRPC handler only converts messages): the open sequences
// and their draft limits, the proposals due this round, and the run-ahead
// of sources that keep their proposals in their state.
//
// Run-ahead: after a proposal is sent, the next one is drafted at once,
// assuming every token is accepted and the worker's bonus token is the
// draft's own next token. A commit of exactly those tokens is answered with
// it immediately, without drafting again.
//
// A control naming an unknown sequence, or one the source refuses (an
// empty prompt, a base beyond what it holds), drops that sequence; the
// worker then decodes it without drafts. Nothing here fails the stream.
//
// Thread-safety: none; one stream's handler uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/sampling/sampling_params.h"
#include "worker/spec/draft_source.h"

namespace tessera::spec {

class DraftSession {
 public:
  // REQUIRES: `source` outlives the session. `max_draft_tokens` caps what
  // any sequence may ask for.
  DraftSession(DraftSource* source, int max_draft_tokens);

  // A sequence starts (or starts again) with its tokens so far.
  void Open(SeqKey seq, const std::vector<TokenId>& tokens, const sampling::SamplingParams& params,
            int max_draft_tokens);
  // The sequence becomes its first base_len tokens followed by `tokens`;
  // max_draft_tokens > 0 changes its limit.
  void Commit(SeqKey seq, int64_t base_len, const std::vector<TokenId>& tokens,
              int max_draft_tokens);
  void Close(SeqKey seq);

  using Proposals = std::vector<std::pair<SeqKey, Draft>>;
  // Sends proposals to the worker; false when the stream broke.
  using SendFn = std::function<bool(const Proposals&)>;

  // One round, after the worker's messages so far were applied: this
  // round's proposals (TakeProposals) go out through `send` at once, then
  // the session runs ahead of them (RunAhead). False when `send` failed.
  bool Round(const SendFn& send);

  // This round's proposals, non-empty ones only: those run ahead for
  // matching commits, then fresh ones for each sequence opened or committed
  // since the last round.
  Proposals TakeProposals();
  // After `sent` went out: drafts the next proposal of each (sources that
  // run ahead).
  void RunAhead(const Proposals& sent);

  int64_t proposals_sent() const { return proposals_sent_; }
  int64_t run_ahead_hits() const { return run_ahead_hits_; }

 private:
  struct Ahead {
    int64_t commit_base = 0;
    std::vector<TokenId> expect;  // the sent proposal + the guessed bonus
    Draft proposal;
  };
  int Limit(SeqKey seq) const;
  void Drop(SeqKey seq);

  DraftSource& source_;
  const int max_draft_tokens_;
  absl::flat_hash_map<SeqKey, int> limits_;  // open sequences
  absl::flat_hash_map<SeqKey, Ahead> ahead_;
  absl::flat_hash_map<SeqKey, Draft> ready_;  // to send this round
  std::vector<SeqKey> changed_;
  int64_t proposals_sent_ = 0;
  int64_t run_ahead_hits_ = 0;
};

}  // namespace tessera::spec
