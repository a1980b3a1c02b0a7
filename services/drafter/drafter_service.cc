#include "services/drafter/drafter_service.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"

namespace tessera::services {
namespace {

using tessera::v1::DraftControl;
using tessera::v1::DraftProposal;

// The worker's messages, handed from the reader thread to the handler.
class Inbox {
 public:
  void Push(DraftControl c) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(c));
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Waits up to `timeout` for messages; returns them (maybe none). Sets
  // *closed once the reader is done and the queue is empty.
  std::vector<DraftControl> Take(absl::Duration timeout, bool* closed) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !queue_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    std::vector<DraftControl> out(std::make_move_iterator(queue_.begin()),
                                  std::make_move_iterator(queue_.end()));
    queue_.clear();
    *closed = closed_ && out.empty();
    return out;
  }

 private:
  absl::Mutex mu_;
  std::deque<DraftControl> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

sampling::SamplingParams ToParams(const tessera::v1::SamplingParams& p) {
  sampling::SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_seed()) s.seed = p.seed();
  return s;
}

}  // namespace

DrafterService::DrafterService(DrainState* drain, SourceFactory factory,
                               DrafterServiceOptions options)
    : drain_(drain), factory_(std::move(factory)), options_(options) {}

grpc::Status DrafterService::Speculate(
    grpc::ServerContext* context, grpc::ServerReaderWriter<DraftProposal, DraftControl>* stream) {
  if (drain_->draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "drafter is draining");
  }
  if (!factory_) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "this drafter has no draft source attached");
  }
  absl::StatusOr<std::unique_ptr<spec::DraftSource>> made = factory_();
  if (!made.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("cannot create the draft source: ", made.status().message()));
  }
  spec::DraftSource& source = **made;
  // Headers now: the worker treats them as "connected".
  stream->SendInitialMetadata();
  Inbox inbox;
  std::thread reader([&] {
    DraftControl c;
    while (stream->Read(&c)) inbox.Push(std::move(c));
    inbox.Close();
  });

  absl::flat_hash_map<spec::SeqKey, int> max_tokens;  // open sequences
  // Run-ahead (sources whose proposals stay in their state): after sending
  // a proposal, the next one is drafted at once, assuming every token is
  // accepted and the worker's bonus token is the draft's own next token.
  // A commit of exactly those tokens is answered with it immediately.
  struct Ahead {
    int64_t commit_base = 0;
    std::vector<spec::TokenId> expect;  // the sent proposal + the guessed bonus
    spec::Draft proposal;
  };
  absl::flat_hash_map<spec::SeqKey, Ahead> ahead;
  absl::flat_hash_map<spec::SeqKey, spec::Draft> ready;  // to send this round
  const bool run_ahead = source.runs_ahead();
  std::vector<spec::SeqKey> changed;
  int64_t proposals = 0, run_ahead_hits = 0;
  auto write = [&](spec::SeqKey seq, const spec::Draft& d) {
    DraftProposal p;
    p.set_seq(seq);
    p.set_base_len(d.base_len);
    for (spec::TokenId t : d.tokens) p.add_tokens(t);
    for (int32_t parent : d.parents) p.add_parents(parent);
    for (const spec::DraftDistribution& q : d.q) {
      tessera::v1::DraftDistribution* out = p.add_q();
      for (spec::TokenId t : q.tokens) out->add_token_ids(t);
      for (float prob : q.probs) out->add_probs(prob);
    }
    return stream->Write(p);
  };
  auto limit = [&](spec::SeqKey seq) {
    auto it = max_tokens.find(seq);
    return it == max_tokens.end() ? 0 : std::clamp(it->second, 0, options_.max_draft_tokens);
  };
  grpc::Status result = grpc::Status::OK;
  bool half_closed = false;  // the worker closed its side: the reader is done
  while (true) {
    if (context->IsCancelled()) {
      result = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      break;
    }
    if (drain_->draining()) {
      result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "drafter is draining");
      break;
    }
    bool closed = false;
    std::vector<DraftControl> controls = inbox.Take(absl::Milliseconds(50), &closed);
    if (closed) {
      half_closed = true;
      break;
    }
    changed.clear();
    for (const DraftControl& c : controls) {
      absl::Status s;
      spec::SeqKey seq = 0;
      switch (c.kind_case()) {
        case DraftControl::kOpen: {
          seq = c.open().seq();
          ahead.erase(seq);
          ready.erase(seq);
          source.Close(seq);  // a re-open replaces the sequence
          std::vector<spec::TokenId> tokens(c.open().prompt_ids().begin(),
                                            c.open().prompt_ids().end());
          s = source.Open(seq, tokens, ToParams(c.open().sampling()));
          max_tokens[seq] = c.open().max_draft_tokens();
          break;
        }
        case DraftControl::kCommit: {
          seq = c.commit().seq();
          std::vector<spec::TokenId> tokens(c.commit().tokens().begin(), c.commit().tokens().end());
          if (c.commit().max_draft_tokens() > 0 && max_tokens.contains(seq)) {
            max_tokens[seq] = c.commit().max_draft_tokens();
          }
          ready.erase(seq);
          if (auto a = ahead.find(seq); a != ahead.end()) {
            const bool hit =
                a->second.commit_base == c.commit().base_len() && a->second.expect == tokens;
            if (hit) {  // the source already holds these tokens and the next draft
              ++run_ahead_hits;
              ready[seq] = std::move(a->second.proposal);
              ahead.erase(a);
              continue;
            }
            ahead.erase(a);
          }
          s = source.Update(seq, c.commit().base_len(), tokens);
          break;
        }
        case DraftControl::kClose:
          ahead.erase(c.close().seq());
          ready.erase(c.close().seq());
          source.Close(c.close().seq());
          max_tokens.erase(c.close().seq());
          continue;
        default:
          continue;
      }
      if (!s.ok()) {
        LogDebug("draft sequence dropped", {{"seq", seq}, {"why", std::string(s.message())}});
        source.Close(seq);
        max_tokens.erase(seq);
        continue;
      }
      changed.push_back(seq);
    }
    if (changed.empty() && ready.empty()) continue;
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    std::vector<spec::DraftQuery> queries;
    for (spec::SeqKey seq : changed) {
      if (max_tokens.contains(seq)) queries.push_back({seq, limit(seq)});
    }
    std::vector<spec::Draft> drafts = source.Propose(queries);
    if (options_.inject_delay > absl::ZeroDuration()) absl::SleepFor(options_.inject_delay);
    bool write_failed = false;
    std::vector<std::pair<spec::SeqKey, const spec::Draft*>> sent;
    for (const auto& [seq, d] : ready) sent.push_back({seq, &d});
    for (size_t i = 0; i < drafts.size(); ++i) sent.push_back({queries[i].seq, &drafts[i]});
    for (const auto& [seq, d] : sent) {
      if (d->tokens.empty()) continue;
      if (!write(seq, *d)) {
        write_failed = true;
        break;
      }
      ++proposals;
    }
    if (run_ahead && !write_failed) {
      // Draft the next proposal now: one guessed bonus token, then k more.
      std::vector<spec::DraftQuery> next;
      for (const auto& [seq, d] : sent) {
        if (!d->tokens.empty()) next.push_back({seq, limit(seq) + 1});
      }
      std::vector<spec::Draft> more = source.Propose(next);
      size_t j = 0;
      for (const auto& [seq, d] : sent) {
        if (d->tokens.empty()) continue;
        spec::Draft& m = more[j++];
        if (m.tokens.size() < 2) continue;
        Ahead a;
        // A tree's "all accepted" is its first-child chain (what the source
        // ran ahead with); the next proposal is what hangs below the guessed
        // bonus token (node 0).
        a.commit_base = d->base_len;
        a.expect = spec::FirstChildChain(*d).tokens;
        a.expect.push_back(m.tokens[0]);
        a.proposal = spec::SubtreeBelow(m, 0);
        if (a.proposal.tokens.empty()) continue;
        ahead[seq] = std::move(a);
      }
    }
    ready.clear();
    if (write_failed) break;
  }
  // A reader still blocked in Read (we end first) is unblocked by a cancel;
  // after the worker's half-close the stream ends with `result` (OK).
  if (!half_closed) context->TryCancel();
  reader.join();
  LogInfo(
      "speculation stream ended",
      {{"source", source.name()}, {"proposals", proposals}, {"run_ahead_hits", run_ahead_hits}});
  return result;
}

}  // namespace tessera::services
