// WorkerService: the gRPC adapter of tessera.v1.Worker over an Engine.
//
// Generate validates the request (the messages name the field), submits it
// to the engine and streams tokens as they are sampled; a client cancel or
// deadline aborts the sequence and frees its KV blocks. WatchLoad streams
// load reports with the prefix-cache events since the previous report.
//
// Thread-safety: gRPC calls the handlers from its threads; the engine's
// entry points are thread-safe and the service keeps no other mutable state.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "kernels/registry.h"
#include "services/common/drain.h"
#include "tessera/v1/worker.grpc.pb.h"
#include "worker/engine/engine.h"

namespace tessera::services {

struct WorkerServiceOptions {
  std::string model_name;
  std::string architecture;
  int tensor_parallel_size = 1;
  absl::Duration default_drain_deadline = absl::Seconds(30);
  kernels::SelectionReport backends;
};

class WorkerService final : public tessera::v1::Worker::Service {
 public:
  using DrainFn = std::function<void(absl::Duration deadline, std::string reason)>;

  // REQUIRES: drain outlives the service.
  WorkerService(DrainState* drain, DrainFn request_drain);

  // Attaches the loaded model's engine; until then every RPC but Drain
  // answers UNAVAILABLE ("model is loading"). REQUIRES: engine outlives the
  // service; called once.
  void AttachEngine(engine::Engine* engine, WorkerServiceOptions options);
  // Readiness as GetInfo reports it (set once warm-up has passed).
  void SetReady(bool ready) { ready_.store(ready); }

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
  void FillLoad(tessera::v1::LoadReport* report) const;
  // The attached engine, or null while loading.
  engine::Engine* engine() const { return engine_.load(std::memory_order_acquire); }

  WorkerServiceOptions options_;  // written once, before engine_ is published
  std::atomic<engine::Engine*> engine_{nullptr};
  std::atomic<bool> ready_{false};
  DrainState* drain_;
  DrainFn request_drain_;
};

}  // namespace tessera::services
