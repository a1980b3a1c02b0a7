#include "services/worker/worker_service.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "services/common/sampling_convert.h"
#include "services/common/status.h"
#include "services/common/version.h"
#include "services/worker/worker_request.h"

namespace tessera::services {
namespace {

using tessera::v1::LoadReport;

tessera::v1::FinishReason ToProto(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return tessera::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tessera::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAbort:
      return tessera::v1::FINISH_REASON_CANCELLED;
    case engine::FinishReason::kNone:
      break;
  }
  return tessera::v1::FINISH_REASON_UNSPECIFIED;
}

void AddEvent(const engine::KvCacheEvent& e, LoadReport* report) {
  tessera::v1::BlockEvent* out = report->add_events();
  out->set_kind(e.kind == engine::KvCacheEvent::Kind::kStored
                    ? tessera::v1::BlockEvent::KIND_STORED
                    : tessera::v1::BlockEvent::KIND_REMOVED);
  for (uint64_t h : e.block_hashes) out->add_block_hashes(h);
  out->set_parent_hash(e.parent_hash.value_or(0));
  for (int32_t t : e.token_ids) out->add_token_ids(t);
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

}  // namespace

WorkerService::WorkerService(DrainState* drain, DrainFn request_drain)
    : drain_(drain), request_drain_(std::move(request_drain)) {}

void WorkerService::AttachEngine(engine::Engine* engine, WorkerServiceOptions options) {
  options_ = std::move(options);
  engine_.store(engine, std::memory_order_release);
}

namespace {
const grpc::Status kLoading(grpc::StatusCode::UNAVAILABLE,
                            "the worker is loading its model and is not ready yet");
}  // namespace

grpc::Status WorkerService::Generate(
    grpc::ServerContext* context, const tessera::v1::WorkerGenerateRequest* request,
    grpc::ServerWriter<tessera::v1::WorkerGenerateResponse>* writer) {
  WorkGuard guard(drain_);
  if (!guard.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "worker is draining and accepts no new requests");
  }
  engine::Engine* const eng = engine();
  if (eng == nullptr) return kLoading;
  absl::StatusOr<engine::EngineRequest> converted =
      ToEngineRequest(*request, static_cast<int>(eng->runner().config().vocab_size),
                      eng->options().scheduler.max_model_len, RandomSeed());
  if (!converted.ok()) return ToGrpcStatus(converted.status());
  absl::StatusOr<std::shared_ptr<engine::RequestStream>> stream =
      eng->Submit(std::move(*converted));
  if (!stream.ok()) return ToGrpcStatus(stream.status());

  engine::StreamEvent event;
  while (true) {
    if (context->IsCancelled()) {
      eng->Cancel((*stream)->id());
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    if (drain_->draining() && absl::Now() > drain_->deadline()) {
      eng->Cancel((*stream)->id());
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the worker's drain deadline passed before this request finished; "
                          "resume it elsewhere with the tokens received so far");
    }
    if (!(*stream)->Next(&event, absl::Milliseconds(50))) continue;
    if (!event.error.ok()) return ToGrpcStatus(event.error);
    if (!event.tokens.empty()) {
      tessera::v1::WorkerGenerateResponse response;
      tessera::v1::WorkerChunk* chunk = response.mutable_chunk();
      for (const engine::TokenReport& t : event.tokens) {
        chunk->add_token_ids(t.token);
        if (request->sampling().logprobs()) {
          tessera::v1::TokenLogprob* lp = chunk->add_logprobs();
          lp->set_token_id(t.token);
          lp->set_logprob(t.logprob);
          for (const auto& top : t.top_logprobs) {
            lp->add_top_token_ids(top.token);
            lp->add_top_logprobs(top.logprob);
          }
        }
      }
      if (!writer->Write(response)) {
        eng->Cancel((*stream)->id());
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    if (event.finished) break;
  }
  tessera::v1::WorkerGenerateResponse response;
  tessera::v1::WorkerComplete* done = response.mutable_complete();
  done->set_finish_reason(ToProto(event.finish_reason));
  if (event.stop_token) done->set_stop_token_id(*event.stop_token);
  tessera::v1::Usage* usage = done->mutable_usage();
  usage->set_prompt_tokens(event.prompt_tokens);
  usage->set_completion_tokens(event.output_tokens);
  usage->set_cached_tokens(event.cached_tokens);
  usage->set_draft_tokens(event.draft_tokens);
  usage->set_accepted_tokens(event.accepted_tokens);
  done->set_queue_us(absl::ToInt64Microseconds(event.queue_time));
  done->set_prefill_us(absl::ToInt64Microseconds(event.prefill_time));
  done->set_decode_us(absl::ToInt64Microseconds(event.decode_time));
  writer->Write(response);
  return grpc::Status::OK;
}

void WorkerService::FillLoad(LoadReport* report) const {
  engine::LoadSnapshot load = engine()->Load();
  report->set_running_requests(load.running);
  report->set_waiting_requests(load.waiting);
  report->set_kv_blocks_used(load.kv_blocks_used);
  report->set_kv_blocks_total(load.kv_blocks_total);
  report->set_prefix_cache_hit_rate(load.prefix_cache_hit_rate);
  report->set_waiting_prefill_tokens(load.waiting_prefill_tokens);
  report->set_preemptions(load.preemptions);
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
  engine::Engine* const eng = engine();
  if (eng == nullptr) return kLoading;
  uint64_t sequence = 0;
  uint64_t cursor = 0;
  bool resync = request->include_snapshot();
  {
    // Start at the log's end: a subscriber without a snapshot sees changes
    // from now on.
    bool gap = false;
    eng->EventsSince(UINT64_MAX, &cursor, &gap);
  }
  auto report = [&](LoadReport* r) {
    r->set_sequence(++sequence);
    FillLoad(r);
    bool gap = false;
    uint64_t next = cursor;
    std::vector<engine::NumberedKvEvent> events = eng->EventsSince(cursor, &next, &gap);
    if (resync || gap) {
      r->set_events_reset(true);
      for (const engine::KvCacheEvent& e : eng->CachedBlocks()) AddEvent(e, r);
      resync = false;
    } else {
      for (const engine::NumberedKvEvent& e : events) AddEvent(e.event, r);
    }
    cursor = next;
  };
  // Reports continue through the drain (the router sees the load fall) and
  // the stream ends, with a final report, once the drain is finished.
  while (!context->IsCancelled()) {
    LoadReport r;
    report(&r);
    if (!writer->Write(r)) return grpc::Status::CANCELLED;
    if (drain_->WaitFinishedFor(interval)) {
      LoadReport last;
      report(&last);
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
  engine::Engine* const eng = engine();
  info->set_version(kTesseraVersion);
  if (eng == nullptr) {
    info->set_ready(false);
    return grpc::Status::OK;
  }
  const model::ModelConfig& c = eng->runner().config();
  info->set_model_name(options_.model_name);
  info->set_architecture(options_.architecture);
  info->set_vocab_size(static_cast<int32_t>(c.vocab_size));
  info->set_context_length(eng->options().scheduler.max_model_len);
  info->set_kv_block_size(eng->runner().block_size());
  info->set_kv_blocks_total(eng->runner().num_kv_blocks());
  info->set_tensor_parallel_size(options_.tensor_parallel_size);
  for (int32_t id : eng->options().eos_token_ids) info->add_eos_token_ids(id);
  for (const kernels::Selection& s : options_.backends.selections) {
    tessera::v1::BackendSelection* b = info->add_backends();
    b->set_op(std::string(kernels::OpName(s.op)));
    b->set_chosen(s.chosen);
    b->set_reason(s.why);
    for (const kernels::Rejection& r : s.rejected) b->add_rejected(r.name + ": " + r.reason);
  }
  info->set_version(kTesseraVersion);
  info->set_ready(ready_.load() && !drain_->draining());
  return grpc::Status::OK;
}

}  // namespace tessera::services
