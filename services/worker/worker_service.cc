#include "services/worker/worker_service.h"

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "services/common/version.h"

namespace tessera::services {

using tessera::v1::LoadReport;

WorkerService::WorkerService(WorkerServiceOptions options, DrainState* drain, DrainFn request_drain)
    : options_(options), drain_(drain), request_drain_(std::move(request_drain)) {}

grpc::Status WorkerService::Generate(grpc::ServerContext* context,
                                     const tessera::v1::WorkerGenerateRequest* request,
                                     grpc::ServerWriter<tessera::v1::WorkerGenerateResponse>*) {
  WorkGuard guard(drain_);
  if (!guard.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "worker is draining and accepts no new requests");
  }
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      "this worker has no model runtime attached: token generation needs the "
                      "engine (model loading, scheduler, forward pass), which this build lacks");
}

void WorkerService::FillLoad(LoadReport* report) {
  // No engine is attached: nothing runs, waits or holds KV blocks.
  report->set_running_requests(0);
  report->set_waiting_requests(0);
  report->set_kv_blocks_used(0);
  report->set_kv_blocks_total(0);
  report->set_prefix_cache_hit_rate(0);
  report->set_waiting_prefill_tokens(0);
  report->set_draining(drain_->draining());
}

grpc::Status WorkerService::WatchLoad(grpc::ServerContext* context,
                                      const tessera::v1::WatchLoadRequest* request,
                                      grpc::ServerWriter<LoadReport>* writer) {
  if (request->interval_ms() < 0 || (request->interval_ms() > 0 && request->interval_ms() < 10)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("interval_ms=", request->interval_ms(), ": must be 0 (default 100) or >= 10"));
  }
  absl::Duration interval =
      absl::Milliseconds(request->interval_ms() == 0 ? 100 : request->interval_ms());
  uint64_t sequence = 0;
  // Reports continue through the drain (the router sees the load fall) and
  // the stream ends, with a final report, once the drain is finished.
  while (!context->IsCancelled()) {
    LoadReport report;
    report.set_sequence(++sequence);
    FillLoad(&report);
    if (!writer->Write(report)) return grpc::Status::CANCELLED;
    if (drain_->WaitFinishedFor(interval)) {
      LoadReport last;
      last.set_sequence(++sequence);
      FillLoad(&last);
      writer->Write(last);
      return grpc::Status::OK;
    }
  }
  return grpc::Status::CANCELLED;
}

grpc::Status WorkerService::Drain(grpc::ServerContext*, const tessera::v1::DrainRequest* request,
                                  tessera::v1::DrainResponse* response) {
  if (request->deadline_ms() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "deadline_ms must be >= 0");
  }
  absl::Duration deadline = request->deadline_ms() == 0
                                ? options_.default_drain_deadline
                                : absl::Milliseconds(request->deadline_ms());
  LogInfo("drain requested over gRPC", {{"deadline_ms", absl::ToInt64Milliseconds(deadline)}});
  request_drain_(deadline, "Drain RPC");
  response->set_in_flight_requests(drain_->in_flight());
  return grpc::Status::OK;
}

grpc::Status WorkerService::GetInfo(grpc::ServerContext*, const tessera::v1::GetInfoRequest*,
                                    tessera::v1::WorkerInfo* info) {
  info->set_version(kTesseraVersion);
  info->set_tensor_parallel_size(options_.tensor_parallel_size);
  info->set_ready(false);  // No model is loaded without an engine.
  return grpc::Status::OK;
}

}  // namespace tessera::services
