#include "services/drafter/drafter_service.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

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

DraftProposal ToProposal(spec::SeqKey seq, const spec::Draft& d) {
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
  return p;
}

}  // namespace

void ApplyControl(const DraftControl& c, spec::DraftSession* session) {
  switch (c.kind_case()) {
    case DraftControl::kOpen:
      session->Open(
          c.open().seq(),
          std::vector<spec::TokenId>(c.open().prompt_ids().begin(), c.open().prompt_ids().end()),
          ToParams(c.open().sampling()), c.open().max_draft_tokens());
      return;
    case DraftControl::kCommit:
      session->Commit(
          c.commit().seq(), c.commit().base_len(),
          std::vector<spec::TokenId>(c.commit().tokens().begin(), c.commit().tokens().end()),
          c.commit().max_draft_tokens());
      return;
    case DraftControl::kClose:
      session->Close(c.close().seq());
      return;
    default:
      return;  // an empty message: nothing to do
  }
}

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

  spec::DraftSession session(&source, options_.max_draft_tokens);
  auto send = [&](const spec::DraftSession::Proposals& proposals) {
    if (options_.inject_delay > absl::ZeroDuration()) absl::SleepFor(options_.inject_delay);
    for (const auto& [seq, d] : proposals) {
      if (!stream->Write(ToProposal(seq, d))) return false;
    }
    return true;
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
    for (const DraftControl& c : controls) ApplyControl(c, &session);
    if (!session.Round(send)) break;
  }
  // A reader still blocked in Read (we end first) is unblocked by a cancel;
  // after the worker's half-close the stream ends with `result` (OK).
  if (!half_closed) context->TryCancel();
  reader.join();
  LogInfo("speculation stream ended", {{"source", source.name()},
                                       {"proposals", session.proposals_sent()},
                                       {"run_ahead_hits", session.run_ahead_hits()}});
  return result;
}

}  // namespace tessera::services
