// DrafterService: the gRPC adapter of tessera.v1.Drafter.
//
// Until a draft source is attached, Speculate is refused with UNIMPLEMENTED
// naming what is missing; workers treat that as "no proposals" and decode
// plainly.
//
// Thread-safety: stateless; gRPC calls handlers from its threads.
#pragma once

#include "services/common/drain.h"
#include "tessera/v1/drafter.grpc.pb.h"

namespace tessera::services {

class DrafterService final : public tessera::v1::Drafter::Service {
 public:
  explicit DrafterService(DrainState* drain) : drain_(drain) {}

  grpc::Status Speculate(grpc::ServerContext* context,
                         grpc::ServerReaderWriter<tessera::v1::DraftProposal,
                                                  tessera::v1::DraftControl>* stream) override;

 private:
  DrainState* drain_;
};

}  // namespace tessera::services
