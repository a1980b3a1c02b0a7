// DrafterService: the gRPC adapter of tessera.v1.Drafter over a DraftSource
// (worker/spec/draft_source.h).
//
// Each Speculate stream is one worker's session with its own DraftSource
// (a draft model source has its own KV cache per session; the weights are
// shared through the factory) and its own spec::DraftSession (the open
// sequences, the proposals due, run-ahead; worker/spec/draft_session.h). A
// reader thread queues the worker's Open/Commit/Close messages; the handler
// thread converts and applies everything queued (ApplyControl), then lets
// the session run a round (DraftSession::Round: one batched Propose for
// every sequence that changed, the proposals written, the run-ahead), and
// only converts the proposals for the wire.
// Commits that pile up while a proposal is computed are folded into one
// Update, so no proposal is computed for a prefix the worker has already
// passed.
//
// Errors in one sequence's messages (a base_len the drafter never had, an
// unknown id) drop that sequence and never end the stream; the worker then
// decodes it plainly. The stream ends when the worker closes it (OK), when
// the drafter drains, or when the call is cancelled.
//
// Thread-safety: gRPC calls Speculate from its threads; sessions share only
// the factory, which must be thread-safe.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/drain.h"
#include "tessera/v1/drafter.grpc.pb.h"
#include "worker/spec/draft_session.h"
#include "worker/spec/draft_source.h"

namespace tessera::services {

struct DrafterServiceOptions {
  // Test hook: sleep this long before writing each batch of proposals (a
  // slow drafter).
  absl::Duration inject_delay = absl::ZeroDuration();
  // Upper bound on tokens per proposal, whatever the worker asks.
  int max_draft_tokens = 16;
};

// Applies one of the worker's messages to its session (the conversion from
// the wire; what Speculate does with each message, and what the request
// fuzzer drives).
void ApplyControl(const tessera::v1::DraftControl& control, spec::DraftSession* session);

class DrafterService final : public tessera::v1::Drafter::Service {
 public:
  using SourceFactory = std::function<absl::StatusOr<std::unique_ptr<spec::DraftSource>>()>;

  // REQUIRES: drain outlives the service.
  DrafterService(DrainState* drain, SourceFactory factory, DrafterServiceOptions options = {});

  grpc::Status Speculate(grpc::ServerContext* context,
                         grpc::ServerReaderWriter<tessera::v1::DraftProposal,
                                                  tessera::v1::DraftControl>* stream) override;

 private:
  DrainState* drain_;
  SourceFactory factory_;
  DrafterServiceOptions options_;
};

}  // namespace tessera::services
