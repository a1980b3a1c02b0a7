#include "services/worker/draft_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/log.h"

namespace tessera::services {
namespace {

using tessera::v1::DraftControl;
using tessera::v1::DraftProposal;

constexpr int kVainWaitsBeforeNoWait = 3;
constexpr int64_t kMinProbeInterval = 16;
constexpr int64_t kMaxProbeInterval = 1024;

}  // namespace

DraftClient::DraftClient(DraftClientOptions options, DraftClientObserver* observer)
    : options_(std::move(options)), observer_(observer) {
  static DraftClientObserver* const kNone = new DraftClientObserver();
  if (observer_ == nullptr) observer_ = kNone;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.min_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.max_backoff)));
  channel_ = grpc::CreateCustomChannel(
      options_.target,
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = tessera::v1::Drafter::NewStub(channel_);
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
}

DraftClient::~DraftClient() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  reader_.join();
  writer_.join();
}

bool DraftClient::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

int DraftClient::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_;
}

void DraftClient::Enqueue(DraftControl c) {
  if (connected_) outbox_.push_back(std::move(c));
}

DraftControl DraftClient::OpenMessage(spec::SeqKey seq, const Mirror& m) const {
  DraftControl c;
  tessera::v1::DraftOpen* o = c.mutable_open();
  o->set_seq(seq);
  for (spec::TokenId t : m.tokens) o->add_prompt_ids(t);
  tessera::v1::SamplingParams* s = o->mutable_sampling();
  s->set_temperature(m.params.temperature);
  s->set_top_k(m.params.top_k);
  s->set_top_p(m.params.top_p);
  s->set_min_p(m.params.min_p);
  s->set_seed(m.params.seed);
  o->set_max_draft_tokens(m.max_draft_tokens);
  return c;
}

void DraftClient::Open(spec::SeqKey seq, absl::Span<const spec::TokenId> tokens,
                       const sampling::SamplingParams& params, int max_draft_tokens) {
  absl::MutexLock lock(&mu_);
  Mirror& m = seqs_[seq];
  m.tokens.assign(tokens.begin(), tokens.end());
  m.params = params;
  m.max_draft_tokens = max_draft_tokens;
  m.sent = absl::Now();
  Enqueue(OpenMessage(seq, m));
}

void DraftClient::Commit(spec::SeqKey seq, int64_t base_len, absl::Span<const spec::TokenId> tokens,
                         int max_draft_tokens) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Mirror& m = it->second;
  m.tokens.resize(std::min<size_t>(m.tokens.size(), static_cast<size_t>(base_len)));
  m.tokens.insert(m.tokens.end(), tokens.begin(), tokens.end());
  m.max_draft_tokens = max_draft_tokens;
  m.sent = absl::Now();
  // A proposal for an older length is of no use any more.
  if (auto p = proposals_.find(seq); p != proposals_.end()) {
    if (p->second.base_len != static_cast<int64_t>(m.tokens.size())) proposals_.erase(p);
  }
  DraftControl c;
  tessera::v1::DraftCommit* commit = c.mutable_commit();
  commit->set_seq(seq);
  commit->set_base_len(base_len);
  for (spec::TokenId t : tokens) commit->add_tokens(t);
  commit->set_max_draft_tokens(max_draft_tokens);
  Enqueue(std::move(c));
}

void DraftClient::Close(spec::SeqKey seq) {
  absl::MutexLock lock(&mu_);
  if (seqs_.erase(seq) == 0) return;
  proposals_.erase(seq);
  DraftControl c;
  c.mutable_close()->set_seq(seq);
  Enqueue(std::move(c));
}

std::vector<std::optional<spec::Draft>> DraftClient::GetDrafts(
    absl::Span<const spec::ProposalRequest> requests) {
  std::vector<std::optional<spec::Draft>> out(requests.size());
  absl::MutexLock lock(&mu_);
  ++calls_;
  auto all_here = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!connected_ || shutdown_) return true;
    for (const spec::ProposalRequest& r : requests) {
      auto it = proposals_.find(r.seq);
      if (it == proposals_.end() || it->second.base_len != r.num_tokens) return false;
    }
    return true;
  };
  const bool wait = connected_ && (vain_waits_ < kVainWaitsBeforeNoWait || calls_ >= next_probe_);
  if (wait) {
    if (mu_.AwaitWithTimeout(absl::Condition(&all_here), options_.deadline) && connected_) {
      vain_waits_ = 0;
      probe_interval_ = kMinProbeInterval;
    } else if (++vain_waits_ >= kVainWaitsBeforeNoWait) {
      next_probe_ = calls_ + probe_interval_;
      probe_interval_ = std::min(probe_interval_ * 2, kMaxProbeInterval);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const spec::ProposalRequest& r = requests[i];
    auto it = proposals_.find(r.seq);
    if (it != proposals_.end() && it->second.base_len == r.num_tokens) {
      out[i] = std::move(it->second);
      proposals_.erase(it);
      if (auto m = seqs_.find(r.seq); m != seqs_.end()) m->second.first_missed = -1;
      continue;
    }
    if (it != proposals_.end()) {
      proposals_.erase(it);
      observer_->OnStaleProposal();
    }
    // Remember where we gave up: a proposal for it that comes later is late.
    if (auto m = seqs_.find(r.seq); m != seqs_.end() && m->second.first_missed < 0) {
      m->second.first_missed = r.num_tokens;
    }
  }
  return out;
}

void DraftClient::OnProposal(const DraftProposal& p) {
  spec::Draft d;
  d.base_len = p.base_len();
  d.tokens.assign(p.tokens().begin(), p.tokens().end());
  d.parents.assign(p.parents().begin(), p.parents().end());
  for (const tessera::v1::DraftDistribution& q : p.q()) {
    spec::DraftDistribution dq;
    dq.tokens.assign(q.token_ids().begin(), q.token_ids().end());
    dq.probs.assign(q.probs().begin(), q.probs().end());
    d.q.push_back(std::move(dq));
  }
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(p.seq());
  if (it == seqs_.end()) return;  // closed meanwhile
  Mirror& m = it->second;
  if (d.base_len != static_cast<int64_t>(m.tokens.size())) {
    if (m.first_missed >= 0 && d.base_len >= m.first_missed) {
      observer_->OnLateProposal();
    } else {
      observer_->OnStaleProposal();
    }
    return;
  }
  observer_->OnProposalRoundTrip(absl::Now() - m.sent);
  proposals_[p.seq()] = std::move(d);
}

void DraftClient::ReaderLoop() {
  absl::Duration backoff = options_.min_backoff;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return;
      context_ = &context;
    }
    // Wait (bounded, so shutdown is noticed) for a connection first: a
    // dead drafter costs no RPC attempts.
    bool ok = channel_->WaitForConnected(std::chrono::system_clock::now() +
                                         std::chrono::milliseconds(500));
    std::unique_ptr<grpc::ClientReaderWriter<DraftControl, DraftProposal>> stream;
    if (ok) {
      stream = stub_->Speculate(&context);
      // The drafter sends its headers at once; a failed call returns here
      // too, and then its first Read fails.
      stream->WaitForInitialMetadata();
      absl::MutexLock lock(&mu_);
      connected_ = true;
      vain_waits_ = 0;
      probe_interval_ = kMinProbeInterval;
      ++connections_;
      ++generation_;
      stream_ = stream.get();
      outbox_.clear();
      proposals_.clear();
      for (const auto& [seq, m] : seqs_) outbox_.push_back(OpenMessage(seq, m));
      LogInfo("connected to the drafter",
              {{"target", options_.target}, {"sequences", static_cast<int64_t>(seqs_.size())}});
      backoff = options_.min_backoff;
    }
    DraftProposal p;
    while (ok && stream->Read(&p)) OnProposal(p);
    context.TryCancel();  // unblocks a Write in flight
    {
      absl::MutexLock lock(&mu_);
      const bool was_connected = connected_;
      connected_ = false;
      proposals_.clear();
      outbox_.clear();
      // Wait until the writer is not inside a Write on this stream.
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
      mu_.Await(absl::Condition(&idle));
      stream_ = nullptr;
      context_ = nullptr;
      if (was_connected) {
        LogWarning("lost the drafter; decoding without drafts until it returns",
                   {{"target", options_.target}});
      }
    }
    if (stream) stream->Finish().IgnoreError();
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void DraftClient::WriterLoop() {
  while (true) {
    DraftControl c;
    grpc::ClientReaderWriter<DraftControl, DraftProposal>* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || (stream_ != nullptr && !outbox_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (shutdown_) return;
      c = std::move(outbox_.front());
      outbox_.pop_front();
      stream = stream_;
      writing_ = true;
    }
    const bool ok = stream->Write(c);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok && context_ != nullptr) context_->TryCancel();  // the reader reconnects
  }
}

}  // namespace tessera::services
