// DraftProvider: the engine's view of speculation. The engine tells it what
// its sequences contain (Open once a sequence has sampled its first token,
// Commit after each step that added tokens, Close when it ends) and asks it
// for drafts before scheduling a step. A provider may be in-process
// (LocalDraftProvider, around a DraftSource) or remote (the worker service's
// client of tessera.v1.Drafter); a remote one waits for proposals only up to
// its own per-step deadline, so GetDrafts never blocks a step for long.
//
// Thread-safety: the engine calls every method from its loop thread;
// implementations that talk to other threads synchronize internally.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "worker/sampling/sampling_params.h"
#include "worker/spec/draft_source.h"

namespace tessera::spec {

struct ProposalRequest {
  SeqKey seq = 0;
  int64_t num_tokens = 0;  // the sequence's length now: a usable draft has this base_len
  int max_tokens = 0;      // at most this many draft tokens are verified
};

class DraftProvider {
 public:
  virtual ~DraftProvider() = default;
  virtual void Open(SeqKey seq, absl::Span<const TokenId> tokens,
                    const sampling::SamplingParams& params, int max_draft_tokens) = 0;
  // The sequence had base_len tokens and now also has `tokens`.
  virtual void Commit(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens,
                      int max_draft_tokens) = 0;
  virtual void Close(SeqKey seq) = 0;
  // One entry per request: a draft whose base_len equals num_tokens, or
  // nullopt (none in time, stale, or nothing to propose).
  virtual std::vector<std::optional<Draft>> GetDrafts(
      absl::Span<const ProposalRequest> requests) = 0;
};

// Runs a DraftSource synchronously on the engine thread (the worker's
// in-process mode, and tests).
class LocalDraftProvider final : public DraftProvider {
 public:
  explicit LocalDraftProvider(std::unique_ptr<DraftSource> source) : source_(std::move(source)) {}

  void Open(SeqKey seq, absl::Span<const TokenId> tokens, const sampling::SamplingParams& params,
            int) override {
    source_->Open(seq, tokens, params).IgnoreError();
  }
  void Commit(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens, int) override {
    source_->Update(seq, base_len, tokens).IgnoreError();
  }
  void Close(SeqKey seq) override { source_->Close(seq); }
  std::vector<std::optional<Draft>> GetDrafts(absl::Span<const ProposalRequest> requests) override {
    std::vector<DraftQuery> queries;
    queries.reserve(requests.size());
    for (const ProposalRequest& r : requests) queries.push_back({r.seq, r.max_tokens});
    std::vector<Draft> drafts = source_->Propose(queries);
    std::vector<std::optional<Draft>> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      if (drafts[i].base_len == requests[i].num_tokens && !drafts[i].tokens.empty()) {
        out[i] = std::move(drafts[i]);
      }
    }
    return out;
  }
  DraftSource& source() { return *source_; }

 private:
  std::unique_ptr<DraftSource> source_;
};

}  // namespace tessera::spec
