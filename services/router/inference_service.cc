#include "services/router/inference_service.h"

namespace tessera::services {

grpc::Status InferenceService::Generate(grpc::ServerContext*, const tessera::v1::GenerateRequest*,
                                        grpc::ServerWriter<tessera::v1::GenerateResponse>*) {
  WorkGuard guard(drain_);
  if (!guard.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "router is draining and accepts no new requests");
  }
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "this router has no worker registry or tokenizer attached: it cannot "
                      "route requests yet");
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext*, const tessera::v1::TokenizeRequest*,
                                        tessera::v1::TokenizeResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "this router has no tokenizer loaded: tokenization needs the model's "
                      "tokenizer.json");
}

grpc::Status InferenceService::ListModels(grpc::ServerContext*,
                                          const tessera::v1::ListModelsRequest*,
                                          tessera::v1::ListModelsResponse*) {
  // No worker is registered, so the cluster serves no model.
  return grpc::Status::OK;
}

}  // namespace tessera::services
