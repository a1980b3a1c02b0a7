// InferenceService: the gRPC adapter of the public tessera.v1.Inference API.
//
// Until a worker registry and the text layer are attached, it lists no
// models and refuses Generate and Tokenize with UNIMPLEMENTED, naming what
// is missing.
//
// Thread-safety: stateless; gRPC calls handlers from its threads.
#pragma once

#include "services/common/drain.h"
#include "tessera/v1/inference.grpc.pb.h"

namespace tessera::services {

class InferenceService final : public tessera::v1::Inference::Service {
 public:
  explicit InferenceService(DrainState* drain) : drain_(drain) {}

  grpc::Status Generate(grpc::ServerContext* context, const tessera::v1::GenerateRequest* request,
                        grpc::ServerWriter<tessera::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const tessera::v1::TokenizeRequest* request,
                        tessera::v1::TokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context,
                          const tessera::v1::ListModelsRequest* request,
                          tessera::v1::ListModelsResponse* response) override;

 private:
  DrainState* drain_;
};

}  // namespace tessera::services
