// DraftClient: the worker's side of tessera.v1.Drafter, as the engine's
// spec::DraftProvider.
//
// One bidirectional Speculate stream multiplexes the worker's sequences.
// The engine thread never blocks on the network: Open/Commit/Close update a
// mirror of each sequence's tokens and queue a message for a writer thread;
// a reader thread files proposals by sequence. GetDrafts waits for the
// step's proposals at most `deadline`; a sequence without one decodes
// plainly. Proposals are checked against the mirror when they arrive: one
// built on a length the sequence no longer has is dropped, counted as late
// when the engine had already given up waiting for exactly that length and
// as stale otherwise.
//
// A drafter that keeps missing the deadline is not waited for: after three
// steps in a row that waited in vain, GetDrafts only takes what has already
// arrived and waits again only to probe, after 16 steps, then 32, ... up to
// 1024 while probes keep failing; a step that gets everything in time
// restores waiting. So a slow drafter costs about deadline/1024 per step
// once detected.
//
// When the stream breaks (drafter killed, network), GetDrafts stops waiting
// at once; the reader reconnects with exponential backoff (100 ms doubling
// to 2 s) and re-opens every live sequence from the mirror.
//
// Thread-safety: Open, Commit, Close and GetDrafts are called from the
// engine thread; everything shared with the reader and writer threads is
// under mu_.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/drafter.grpc.pb.h"
#include "worker/spec/draft_provider.h"

namespace tessera::services {

// What the client reports, for metrics. Called from its threads.
class DraftClientObserver {
 public:
  virtual ~DraftClientObserver() = default;
  virtual void OnStaleProposal() {}
  virtual void OnLateProposal() {}
  virtual void OnProposalRoundTrip(absl::Duration rtt) {}
};

struct DraftClientOptions {
  std::string target;                                     // host:port
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = insecure
  absl::Duration deadline = absl::Milliseconds(5);
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
};

class DraftClient final : public spec::DraftProvider {
 public:
  DraftClient(DraftClientOptions options, DraftClientObserver* observer);
  ~DraftClient() override;  // closes the stream and joins the threads

  void Open(spec::SeqKey seq, absl::Span<const spec::TokenId> tokens,
            const sampling::SamplingParams& params, int max_draft_tokens) override;
  void Commit(spec::SeqKey seq, int64_t base_len, absl::Span<const spec::TokenId> tokens,
              int max_draft_tokens) override;
  void Close(spec::SeqKey seq) override;
  std::vector<std::optional<spec::Draft>> GetDrafts(
      absl::Span<const spec::ProposalRequest> requests) override;

  bool connected() const;
  // Streams opened so far (1 after the first connection; more after
  // reconnects).
  int connections() const;

 private:
  struct Mirror {
    std::vector<spec::TokenId> tokens;
    sampling::SamplingParams params;
    int max_draft_tokens = 0;
    absl::Time sent;  // when the latest Open/Commit was queued
    // The first length the engine stopped waiting at since it last got a
    // proposal in time; a proposal for it or later one that arrives after
    // the sequence moved on is late.
    int64_t first_missed = -1;
  };
  void ReaderLoop();
  void WriterLoop();
  void Enqueue(tessera::v1::DraftControl c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  tessera::v1::DraftControl OpenMessage(spec::SeqKey seq, const Mirror& m) const;
  void OnProposal(const tessera::v1::DraftProposal& p);

  const DraftClientOptions options_;
  DraftClientObserver* observer_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tessera::v1::Drafter::Stub> stub_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<tessera::v1::DraftControl, tessera::v1::DraftProposal>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<tessera::v1::DraftControl> outbox_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<spec::SeqKey, Mirror> seqs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<spec::SeqKey, spec::Draft> proposals_ ABSL_GUARDED_BY(mu_);
  int vain_waits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_probe_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t probe_interval_ ABSL_GUARDED_BY(mu_) = 16;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;

  std::thread reader_;
  std::thread writer_;
};

}  // namespace tessera::services
