#include "services/router/inference_service.h"

#include <openssl/crypto.h>

#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "grpcpp/create_channel.h"
#include "router/retry.h"
#include "router/text/stop_strings.h"
#include "services/common/status.h"
#include "worker/tokenizer/incremental_detokenizer.h"

namespace tessera::services {
namespace {

using tessera::v1::GenerateRequest;
using tessera::v1::GenerateResponse;

router::Priority ToPriority(tessera::v1::Priority p) {
  switch (p) {
    case tessera::v1::PRIORITY_LOW:
      return router::Priority::kLow;
    case tessera::v1::PRIORITY_HIGH:
      return router::Priority::kHigh;
    default:
      return router::Priority::kNormal;
  }
}

// Constant-time comparison of two strings of possibly different lengths.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

InferenceService::InferenceService(InferenceServiceOptions options, router::Router* router,
                                   std::unique_ptr<Tokenizer> tokenizer, DrainState* drain,
                                   RouterMetrics* metrics)
    : options_(std::move(options)),
      router_(router),
      tokenizer_(std::move(tokenizer)),
      drain_(drain),
      metrics_(metrics),
      admission_(options_.admission) {
  context_length_ = options_.context_length;
}

InferenceService::~InferenceService() { StopUpstreams(); }

void InferenceService::SetWorkers(const std::vector<std::string>& addresses) {
  router::ReconcileResult changes = router_->Reconcile(addresses);
  (void)changes;
  absl::MutexLock lock(&mu_);
  // Drop upstreams no longer listed.
  for (auto it = upstreams_.begin(); it != upstreams_.end();) {
    if (std::find(addresses.begin(), addresses.end(), it->first) == addresses.end()) {
      LogInfo("worker removed", {{"worker", it->first}});
      it = upstreams_.erase(it);
    } else {
      ++it;
    }
  }
  for (const std::string& a : addresses) {
    if (upstreams_.count(a)) continue;
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(a, options_.upstream_credentials, args);
    auto up = std::make_unique<WorkerUpstream>(a, channel, this, options_.load_interval_ms);
    up->Start();
    LogInfo("worker added", {{"worker", a}});
    upstreams_[a] = std::move(up);
  }
}

void InferenceService::StopUpstreams() {
  std::map<std::string, std::unique_ptr<WorkerUpstream>> ups;
  {
    absl::MutexLock lock(&mu_);
    ups.swap(upstreams_);
  }
  ups.clear();
}

tessera::v1::Worker::Stub* InferenceService::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = upstreams_.find(address);
  return it == upstreams_.end() ? nullptr : it->second->stub();
}

void InferenceService::OnInfo(const std::string& address, const tessera::v1::WorkerInfo& info) {
  router::WorkerStaticInfo s;
  s.kv_block_size = info.kv_block_size();
  s.kv_blocks_total = info.kv_blocks_total();
  s.context_length = info.context_length();
  if (auto st = router_->SetWorkerInfo(address, s); !st.ok()) {
    LogWarning("worker info not applied",
               {{"worker", address}, {"error", std::string(st.message())}});
  }
  if (context_length_.load() == 0) context_length_ = info.context_length();
}

void InferenceService::OnHealth(const std::string& address, bool serving) {
  router_
      ->SetHealth(address,
                  serving ? router::HealthState::kServing : router::HealthState::kNotServing)
      .IgnoreError();
  metrics_->worker_healthy.Add({{"worker", address}}).Set(serving ? 1 : 0);
}

void InferenceService::OnLoad(const std::string& address, const tessera::v1::LoadReport& r) {
  router::LoadReportView view;
  view.sequence = r.sequence();
  view.load.running_requests = r.running_requests();
  view.load.waiting_requests = r.waiting_requests();
  view.load.kv_blocks_used = r.kv_blocks_used();
  view.load.kv_blocks_total = r.kv_blocks_total();
  view.load.waiting_prefill_tokens = r.waiting_prefill_tokens();
  view.load.draining = r.draining();
  view.events_reset = r.events_reset();
  std::vector<router::BlockEvent> events;
  events.reserve(r.events_size());
  for (const tessera::v1::BlockEvent& e : r.events()) {
    router::BlockEvent b;
    b.kind = e.kind() == tessera::v1::BlockEvent::KIND_REMOVED ? router::BlockEvent::Kind::kRemoved
                                                               : router::BlockEvent::Kind::kStored;
    b.block_hashes = absl::MakeConstSpan(e.block_hashes().data(), e.block_hashes_size());
    b.parent_hash = e.parent_hash();
    b.token_ids = absl::MakeConstSpan(e.token_ids().data(), e.token_ids_size());
    events.push_back(b);
  }
  view.events = events;
  absl::Status s = router_->ApplyLoadReport(address, view);
  if (!s.ok()) {
    LogDebug("load report not fully applied",
             {{"worker", address}, {"error", std::string(s.message())}});
  }
  metrics_->worker_running.Add({{"worker", address}}).Set(r.running_requests());
  metrics_->worker_waiting.Add({{"worker", address}}).Set(r.waiting_requests());
  metrics_->worker_kv_usage.Add({{"worker", address}})
      .Set(r.kv_blocks_total() ? static_cast<double>(r.kv_blocks_used()) / r.kv_blocks_total() : 0);
}

grpc::Status InferenceService::Authenticate(const grpc::ServerContext& context) const {
  if (options_.api_keys.empty()) return grpc::Status::OK;
  auto it = context.client_metadata().find("authorization");
  if (it == context.client_metadata().end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing API key: send 'authorization: Bearer <key>' metadata");
  }
  std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  std::string key = value.rfind(prefix, 0) == 0 ? value.substr(prefix.size()) : "";
  bool ok = false;
  for (const std::string& k : options_.api_keys) ok |= SameSecret(key, k);  // no early exit
  if (!ok) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid API key");
  return grpc::Status::OK;
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context, const GenerateRequest* req,
                                        grpc::ServerWriter<GenerateResponse>* writer) {
  const absl::Time arrival = absl::Now();
  auto finish = [&](const std::string& outcome, grpc::Status s) {
    metrics_->Request(outcome);
    return s;
  };
  if (grpc::Status s = Authenticate(*context); !s.ok()) return finish("unauthenticated", s);
  WorkGuard guard(drain_);
  if (!guard.ok()) {
    return finish("unavailable", grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                              "router is draining and accepts no new requests"));
  }
  if (!req->model().empty() && req->model() != options_.model_name) {
    return finish("invalid",
                  grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("model '", req->model(),
                                            "' is not served here; this cluster serves '",
                                            options_.model_name, "'")));
  }
  // The prompt as token ids.
  std::vector<int32_t> prompt;
  if (req->has_token_ids()) {
    prompt.assign(req->token_ids().ids().begin(), req->token_ids().ids().end());
  } else if (req->prompt_case() == GenerateRequest::kText) {
    if (!tokenizer_) {
      return finish("invalid", grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                            "this router has no tokenizer (--tokenizer): send "
                                            "token_ids instead of text"));
    }
    EncodeOptions eo;
    eo.add_special_tokens = !req->no_bos();
    auto ids = tokenizer_->Encode(req->text(), eo);
    if (!ids.ok()) return finish("invalid", ToGrpcStatus(ids.status()));
    prompt = std::move(*ids);
  }
  if (prompt.empty()) {
    return finish("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "the prompt is empty: give text or token_ids"));
  }
  const auto& stops = req->sampling().stop();
  if (!stops.empty() && !tokenizer_) {
    return finish("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "stop strings need a tokenizer on the router"));
  }
  // Admission: wait in this priority's queue (bounded) for an in-flight slot.
  absl::Time queue_deadline = absl::Now() + options_.max_queue_wait;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    queue_deadline = std::min(queue_deadline, absl::FromChrono(context->deadline()));
  }
  const router::Priority priority = ToPriority(req->priority());
  absl::StatusOr<router::AdmissionTicket> ticket = admission_.TryAdmit(priority);
  if (!ticket.ok() && ticket.status().code() == absl::StatusCode::kResourceExhausted) {
    // Full: wait in the priority's queue. A client that cancels meanwhile
    // leaves the queue (the sync API can only poll for cancellation).
    std::atomic<bool> cancelled{false}, waiting{true};
    std::thread watch([&] {
      while (waiting.load() && !context->IsCancelled()) absl::SleepFor(absl::Milliseconds(20));
      if (context->IsCancelled()) cancelled = true;
    });
    ticket = admission_.Admit(priority, queue_deadline, &cancelled);
    waiting = false;
    watch.join();
  }
  if (!ticket.ok()) {
    if (auto hint = router::RetryAfterFromStatus(ticket.status())) {
      context->AddTrailingMetadata("retry-after-ms",
                                   absl::StrCat(absl::ToInt64Milliseconds(*hint)));
    }
    return finish("rejected", ToGrpcStatus(ticket.status()));
  }
  metrics_->in_flight.Increment();
  struct Release {
    RouterMetrics* m;
    ~Release() { m->in_flight.Decrement(); }
  } release{metrics_};

  // One worker request template; generated_ids grow with migrations.
  tessera::v1::WorkerGenerateRequest wreq;
  wreq.set_request_id(req->request_id());
  for (int32_t t : prompt) wreq.add_prompt_ids(t);
  *wreq.mutable_sampling() = req->sampling();
  wreq.mutable_sampling()->clear_stop();  // stop strings are the router's job
  wreq.set_priority(req->priority());
  // Retry and migration bookkeeping: tokens delivered so far, workers tried,
  // the seed that keeps a migrated request's random stream.
  router::RetryOptions retry_options;
  retry_options.max_attempts = options_.max_attempts;
  router::RequestAttempts attempts(
      retry_options, prompt,
      req->sampling().has_max_tokens() ? req->sampling().max_tokens()
                                       : std::numeric_limits<int32_t>::max(),
      req->sampling().has_seed() ? std::optional<uint64_t>(req->sampling().seed()) : std::nullopt);
  wreq.mutable_sampling()->set_seed(attempts.seed());

  std::optional<IncrementalDetokenizer> detok;
  if (tokenizer_) detok.emplace(tokenizer_.get(), !req->keep_special_tokens());
  router::StopStringMatcher stop_matcher(std::vector<std::string>(stops.begin(), stops.end()));

  tessera::v1::Complete complete;
  complete.set_request_id(req->request_id());
  int cached_tokens = -1;
  std::optional<absl::Time> last_token_time;
  bool done = false;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no worker could take the request");

  while (!done) {
    if (context->IsCancelled()) return finish("cancelled", grpc::Status::CANCELLED);
    // Route over everything the worker will prefill.
    router::RouteRequest rr;
    rr.token_ids = attempts.routing_tokens();
    rr.routing_key = req->routing_key();
    rr.priority = ToPriority(req->priority());
    rr.exclude = attempts.tried_workers();
    absl::Time route_start = absl::Now();
    absl::StatusOr<router::RouteDecision> decision = router_->RouteAndAssign(rr);
    metrics_->route_decision.Observe(absl::ToDoubleSeconds(absl::Now() - route_start));
    if (!decision.ok()) {
      last_error = ToGrpcStatus(decision.status());
      break;
    }
    const bool resumed = !attempts.generated_ids().empty();
    if (attempts.attempts() > 0) (resumed ? metrics_->migrations : metrics_->retries).Increment();
    attempts.OnAttemptStarted(decision->worker_id);
    tessera::v1::Worker::Stub* stub = StubFor(decision->worker_id);
    if (stub == nullptr) {  // removed from the worker list meanwhile
      router_->OnFinished(*decision);
      router::RetryVerdict v = attempts.OnAttemptFailed(
          {absl::UnavailableError("worker removed"), router::UpstreamErrorKind::kConnectFailure});
      if (v.step == router::NextStep::kFail) {
        last_error = ToGrpcStatus(v.status);
        break;
      }
      continue;
    }
    metrics_->prefix_hit_tokens.Increment(decision->cached_tokens);

    wreq.clear_generated_ids();
    for (int32_t t : attempts.generated_ids()) wreq.add_generated_ids(t);
    // Deadline and cancellation of the client's call follow the worker call.
    std::unique_ptr<grpc::ClientContext> wctx = grpc::ClientContext::FromServerContext(*context);
    auto stream = stub->Generate(wctx.get(), wreq);
    tessera::v1::WorkerGenerateResponse wresp;
    bool first = true;
    while (!done && stream->Read(&wresp)) {
      if (first) {
        router_->RecordSuccess(decision->worker_id);
        first = false;
      }
      if (wresp.has_chunk()) {
        GenerateResponse out;
        tessera::v1::Chunk* chunk = out.mutable_chunk();
        // Tokens go through the detokenizer and the stop matcher one by one,
        // so a stop string ends the chunk at the token that completed it.
        std::string text;
        std::optional<std::string> matched;
        for (int i = 0; i < wresp.chunk().token_ids_size() && !matched; ++i) {
          int32_t t = wresp.chunk().token_ids(i);
          attempts.OnTokens(absl::MakeConstSpan(&t, 1));
          chunk->add_token_ids(t);
          if (i < wresp.chunk().logprobs_size()) *chunk->add_logprobs() = wresp.chunk().logprobs(i);
          if (!detok) continue;
          auto delta = detok->Add(t);
          if (!delta.ok()) continue;
          router::StopStringMatcher::Result r = stop_matcher.Add(*delta);
          text += r.text;
          matched = r.matched;
        }
        chunk->set_text(text);
        absl::Time now = absl::Now();
        if (!last_token_time) {
          metrics_->ttft.Observe(absl::ToDoubleSeconds(now - arrival));
        } else {
          metrics_->inter_token_latency.Observe(absl::ToDoubleSeconds(now - *last_token_time) /
                                                std::max(1, chunk->token_ids_size()));
        }
        last_token_time = now;
        metrics_->generation_tokens.Increment(chunk->token_ids_size());
        if (!writer->Write(out)) {
          wctx->TryCancel();
          router_->OnFinished(*decision);
          return finish("cancelled", grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
        }
        if (matched) {
          complete.set_finish_reason(tessera::v1::FINISH_REASON_STOP);
          complete.set_matched_stop(*matched);
          wctx->TryCancel();  // the worker stops generating
          done = true;
        }
      }
      if (wresp.has_complete()) {
        const tessera::v1::WorkerComplete& wc = wresp.complete();
        complete.set_finish_reason(wc.finish_reason());
        if (wc.has_stop_token_id()) complete.set_matched_stop(absl::StrCat(wc.stop_token_id()));
        if (cached_tokens < 0) cached_tokens = wc.usage().cached_tokens();
        done = true;
      }
    }
    grpc::Status s = stream->Finish();
    router_->OnFinished(*decision);
    if (done) break;
    if (context->IsCancelled()) return finish("cancelled", grpc::Status::CANCELLED);
    // Classify the failure: a call that never got an answer is a connect
    // failure; a call the worker cut (CANCELLED while our client did not
    // cancel) is the worker going away; otherwise the status decides.
    router::UpstreamError error{FromGrpcStatus(s), router::UpstreamErrorKind::kStatus};
    if (s.ok()) {
      error.status = absl::UnavailableError("the worker's stream ended without completion");
    } else if (first && s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      error.kind = router::UpstreamErrorKind::kConnectFailure;
    } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
      error.kind = router::UpstreamErrorKind::kWorkerDraining;
    }
    if (router::CountsAsWorkerFailure(error)) router_->RecordFailure(decision->worker_id);
    router::RetryVerdict verdict = attempts.OnAttemptFailed(error);
    if (verdict.step == router::NextStep::kComplete) {
      complete.set_finish_reason(tessera::v1::FINISH_REASON_LENGTH);
      done = true;
      break;
    }
    if (verdict.step == router::NextStep::kFail) {
      // A request error (e.g. INVALID_ARGUMENT) is the client's to see.
      grpc::Status status = ToGrpcStatus(verdict.status);
      if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        return finish("invalid", status);
      }
      last_error = status;
      break;
    }
    LogWarning(verdict.step == router::NextStep::kRetry ? "retrying on another worker"
                                                        : "migrating to another worker",
               {{"worker", decision->worker_id},
                {"error", s.error_message()},
                {"tokens_sent", static_cast<int64_t>(attempts.generated_ids().size())}});
    last_error = ToGrpcStatus(error.status);
  }
  if (!done) {
    if (last_error.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      context->AddTrailingMetadata("retry-after-ms", "200");
    }
    return finish("unavailable", last_error);
  }
  // Text held back by the detokenizer or the stop matcher.
  if (detok && !stop_matcher.matched()) {
    std::string rest = stop_matcher.Add(detok->Finish()).text + stop_matcher.Finish();
    if (!rest.empty()) {
      GenerateResponse out;
      out.mutable_chunk()->set_text(rest);
      writer->Write(out);
    }
  }
  tessera::v1::Usage* usage = complete.mutable_usage();
  usage->set_prompt_tokens(static_cast<int32_t>(prompt.size()));
  usage->set_completion_tokens(static_cast<int32_t>(attempts.generated_ids().size()));
  usage->set_cached_tokens(std::max(0, cached_tokens));
  metrics_->prompt_tokens.Increment(prompt.size());
  GenerateResponse last;
  *last.mutable_complete() = complete;
  writer->Write(last);
  metrics_->e2e.Observe(absl::ToDoubleSeconds(absl::Now() - arrival));
  return finish("ok", grpc::Status::OK);
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context,
                                        const tessera::v1::TokenizeRequest* req,
                                        tessera::v1::TokenizeResponse* resp) {
  if (grpc::Status s = Authenticate(*context); !s.ok()) return s;
  if (!tokenizer_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this router has no tokenizer (--tokenizer)");
  }
  EncodeOptions eo;
  eo.add_special_tokens = req->add_special_tokens();
  auto ids = tokenizer_->Encode(req->text(), eo);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  for (int32_t t : *ids) resp->add_token_ids(t);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* context,
                                          const tessera::v1::ListModelsRequest*,
                                          tessera::v1::ListModelsResponse* resp) {
  if (grpc::Status s = Authenticate(*context); !s.ok()) return s;
  int healthy = 0;
  for (const router::WorkerReport& w : router_->Report())
    healthy += w.status.unroutable == router::Unroutable::kNone ? 1 : 0;
  tessera::v1::ModelInfo* m = resp->add_models();
  m->set_name(options_.model_name);
  m->set_context_length(context_length_.load());
  m->set_healthy_workers(healthy);
  return grpc::Status::OK;
}

}  // namespace tessera::services
