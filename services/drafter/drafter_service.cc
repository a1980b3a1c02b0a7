#include "services/drafter/drafter_service.h"

namespace tessera::services {

grpc::Status DrafterService::Speculate(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<tessera::v1::DraftProposal, tessera::v1::DraftControl>*) {
  WorkGuard guard(drain_);
  if (!guard.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "drafter is draining");
  }
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "this drafter has no draft source attached (n-gram, suffix or draft "
                      "model); it cannot propose tokens");
}

}  // namespace tessera::services
