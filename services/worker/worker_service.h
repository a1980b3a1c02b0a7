// WorkerService: the gRPC adapter of tessera.v1.Worker.
//
// Load reports come from a LoadSource (the engine, once one is attached);
// without an engine the worker reports an empty load and refuses Generate
// with UNIMPLEMENTED, naming what is missing.
//
// Thread-safety: gRPC calls the handlers from its threads; the service holds
// no mutable state of its own beyond atomics.
#pragma once

#include <atomic>
#include <functional>

#include "services/common/drain.h"
#include "tessera/v1/worker.grpc.pb.h"

namespace tessera::services {

struct WorkerServiceOptions {
  int tensor_parallel_size = 1;
  absl::Duration default_drain_deadline = absl::Seconds(30);
};

class WorkerService final : public tessera::v1::Worker::Service {
 public:
  using DrainFn = std::function<void(absl::Duration deadline, std::string reason)>;

  WorkerService(WorkerServiceOptions options, DrainState* drain, DrainFn request_drain);

  grpc::Status Generate(grpc::ServerContext* context,
                        const tessera::v1::WorkerGenerateRequest* request,
                        grpc::ServerWriter<tessera::v1::WorkerGenerateResponse>* writer) override;
  grpc::Status WatchLoad(grpc::ServerContext* context, const tessera::v1::WatchLoadRequest* request,
                         grpc::ServerWriter<tessera::v1::LoadReport>* writer) override;
  grpc::Status Drain(grpc::ServerContext* context, const tessera::v1::DrainRequest* request,
                     tessera::v1::DrainResponse* response) override;
  grpc::Status GetInfo(grpc::ServerContext* context, const tessera::v1::GetInfoRequest* request,
                       tessera::v1::WorkerInfo* response) override;

 private:
  void FillLoad(tessera::v1::LoadReport* report);

  WorkerServiceOptions options_;
  DrainState* drain_;
  DrainFn request_drain_;
};

}  // namespace tessera::services
