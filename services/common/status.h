// The one place where absl::Status and grpc::Status are converted.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera::services {

// Maps an absl status to a gRPC status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Maps a gRPC status back to absl (used by clients of other services).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera::services
