#include "services/router/inference_service.h"

#include <malloc.h>
#include <openssl/crypto.h>

#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_callback.h"
#include "router/retry.h"
#include "text/stop_strings.h"
#include "services/common/sampling_convert.h"
#include "services/common/status.h"
#include "services/router/request_checks.h"
#include "text/tokenizer/incremental_detokenizer.h"

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
      admission_(options_.admission),
      tokenize_pool_(std::max(1, options_.tokenize_threads), kTokenizeQueue) {
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

grpc::Status InferenceService::Authenticate(const grpc::ServerContextBase& context) const {
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

grpc::Status InferenceService::CheckPromptBytes(size_t bytes) const {
  return ToGrpcStatus(services::CheckPromptBytes(bytes, options_.max_prompt_bytes,
                                                 context_length_.load(), tokenizer_.get()));
}

grpc::Status InferenceService::CheckModel(const std::string& model) const {
  return ToGrpcStatus(CheckModelName(model, options_.model_name));
}

// --- Generate: one reactor per stream -------------------------------------------

namespace {

using tessera::v1::WorkerGenerateRequest;
using tessera::v1::WorkerGenerateResponse;

// The worker side of one attempt: a server-streaming call on the callback
// API. It only forwards its reactions to the GenerateCall that owns it.
class WorkerCall final : public grpc::ClientReadReactor<WorkerGenerateResponse> {
 public:
  using ReadDone = std::function<void(bool ok)>;
  using Done = std::function<void(grpc::Status status)>;

  WorkerCall(std::unique_ptr<grpc::ClientContext> context, WorkerGenerateRequest request,
             ReadDone on_read, Done on_done)
      : context_(std::move(context)),
        request_(std::move(request)),
        on_read_(std::move(on_read)),
        on_done_(std::move(on_done)) {}

  // Starts the call with the first read outstanding. The call is held (see
  // StopReading) because later reads start outside this reactor's own
  // reactions, from the client's OnWriteDone.
  void Start(tessera::v1::Worker::Stub* stub) {
    stub->async()->Generate(context_.get(), &request_, this);
    AddHold();
    StartRead(&response_);
    StartCall();
  }
  // REQUIRES: the previous read completed with ok, and StopReading was not
  // called.
  void ReadNext() { StartRead(&response_); }
  // No read will follow: lets the call end (OnDone runs once its status is
  // in). Idempotent.
  void StopReading() {
    if (!held_) return;
    held_ = false;
    RemoveHold();
  }
  void Cancel() { context_->TryCancel(); }
  const WorkerGenerateResponse& response() const { return response_; }

  void OnReadDone(bool ok) override { on_read_(ok); }
  // The last reaction; the owner may destroy this object from inside it.
  void OnDone(const grpc::Status& status) override { on_done_(status); }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  WorkerGenerateRequest request_;
  WorkerGenerateResponse response_;
  ReadDone on_read_;
  Done on_done_;
  bool held_ = true;  // touched only by the owning GenerateCall's events
};

}  // namespace

// Texts longer than this are tokenized on the TokenizePool (about a
// millisecond of work inline).
constexpr size_t kInlineTokenizeBytes = 64 << 10;
// Requests at least this large trim the allocator when they end.
constexpr size_t kTrimAfterBytes = 1 << 20;

// One Generate stream. Every reaction (gRPC's, the worker call's, the
// admission queue's) is turned into an event; events run one at a time, in
// order, on the thread that posted the first of a burst (an actor), with no
// lock held while they run. So the handlers below need no locking among
// themselves, may start gRPC operations whose reactions come back on the
// same thread (they queue behind the current event), and never block.
//
// Lifetime: Finish is called only when no worker call is alive, no
// admission verdict is outstanding and no write is pending; OnDone is then
// the last event, and the object deletes itself after handling it.
//
// Backpressure: one write to the client and one read from the worker at a
// time; the next worker message is read only after the client's write of
// the previous one completed.
class GenerateCall final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  GenerateCall(InferenceService* service, grpc::CallbackServerContext* context,
               const GenerateRequest* request)
      : service_(service),
        context_(context),
        request_(request),
        request_bytes_(request->ByteSizeLong()),
        arrival_(absl::Now()) {
    {
      absl::MutexLock lock(&service_->calls_mu_);
      service_->calls_.insert(this);
    }
    Post(Event{Event::kStart});
  }
  ~GenerateCall() override {
    {
      absl::MutexLock lock(&service_->calls_mu_);
      service_->calls_.erase(this);
    }
    // A large request leaves its receive buffers free in the allocator's
    // arenas; hand them back to the system instead of keeping them.
    if (request_bytes_ >= kTrimAfterBytes) malloc_trim(0);
  }

  // The router's drain deadline passed: end the stream with a final message
  // (see InferenceService::CutOpenStreams for why this only enqueues).
  // Returns true when the caller must Run() the queue.
  bool EnqueueCut() { return Enqueue(Event{Event::kCut}); }
  void Run() {
    bool destroy = false;
    for (;;) {
      Event next{Event::kStart};
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (events_.empty()) {
          running_ = false;
          destroy = call_done_;
          dying_ = destroy;
          break;
        }
        next = std::move(events_.front());
        events_.pop_front();
      }
      Handle(next);
    }
    // Nothing posts after OnDone (see "Lifetime").
    if (destroy) delete this;
  }

  void OnWriteDone(bool ok) override {
    Event e{Event::kWriteDone};
    e.ok = ok;
    Post(std::move(e));
  }
  void OnCancel() override { Post(Event{Event::kCancel}); }
  void OnDone() override { Post(Event{Event::kDone}); }

 private:
  struct Event {
    enum Kind {
      kStart,
      kAdmitted,
      kWorkerRead,
      kWorkerDone,
      kWriteDone,
      kCancel,
      kCut,
      kTokenized,
      kDone
    } kind;
    bool ok = false;
    grpc::Status status;
    std::optional<absl::StatusOr<std::vector<int32_t>>> ids;
    std::optional<absl::StatusOr<router::AdmissionTicket>> ticket;
  };
  enum class Phase { kAdmission, kStreaming, kTail, kFinished };

  void Post(Event e) {
    if (Enqueue(std::move(e))) Run();
  }
  // True when the queue was idle: the caller now runs it (Run).
  bool Enqueue(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dying_) return false;  // past its last event: the object is going
    events_.push_back(std::move(e));
    if (running_) return false;
    running_ = true;
    return true;
  }

  void Handle(Event& e) {
    switch (e.kind) {
      case Event::kStart:
        Start();
        break;
      case Event::kAdmitted:
        OnAdmitted(std::move(*e.ticket));
        break;
      case Event::kWorkerRead:
        OnWorkerRead(e.ok);
        break;
      case Event::kWorkerDone:
        OnWorkerDone(std::move(e.status));
        break;
      case Event::kWriteDone:
        OnWritten(e.ok);
        break;
      case Event::kCancel:
        OnClientCancel();
        break;
      case Event::kCut:
        OnCut();
        break;
      case Event::kTokenized:
        OnTokenized(std::move(*e.ids));
        break;
      case Event::kDone:
        call_done_ = true;
        break;
    }
  }

  RouterMetrics* metrics() const { return service_->metrics_; }

  // Validation, tokenization, then admission.
  void Start() {
    InferenceService* s = service_;
    if (grpc::Status st = s->Authenticate(*context_); !st.ok()) {
      return FinishWith("unauthenticated", st);
    }
    guard_ = std::make_unique<WorkGuard>(s->drain_);
    if (!guard_->ok()) {
      return FinishWith("unavailable",
                        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     "router is draining and accepts no new requests"));
    }
    const GenerateRequest& req = *request_;
    if (grpc::Status st = s->CheckModel(req.model()); !st.ok()) return FinishWith("invalid", st);
    if (absl::Status st = CheckKnownSamplingFields(req.sampling()); !st.ok()) {
      return FinishWith("invalid", ToGrpcStatus(st));
    }
    // The prompt as token ids.
    if (req.has_token_ids()) {
      prompt_.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
    } else if (req.prompt_case() == GenerateRequest::kText) {
      if (!s->tokenizer_) {
        return FinishWith("invalid",
                          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                       "this router has no tokenizer (--tokenizer): send "
                                       "token_ids instead of text"));
      }
      if (grpc::Status st = s->CheckPromptBytes(req.text().size()); !st.ok()) {
        return FinishWith("invalid", st);
      }
      if (req.text().size() > kInlineTokenizeBytes) {
        // A long text is tokenized on the pool; the result comes back as
        // an event.
        const bool queued = s->tokenize_pool_.TrySubmit([this] {
          Event e{Event::kTokenized};
          e.ids = Tokenize();
          Post(std::move(e));
        });
        if (queued) return;
        return FinishWith("rejected",
                          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                       "too many long prompts are waiting to be tokenized"));
      }
      auto ids = Tokenize();
      if (!ids.ok()) return FinishWith("invalid", ToGrpcStatus(ids.status()));
      prompt_ = std::move(*ids);
    }
    AdmitPrompt();
  }

  absl::StatusOr<std::vector<int32_t>> Tokenize() const {
    EncodeOptions eo;
    eo.add_special_tokens = !request_->no_bos();
    return service_->tokenizer_->Encode(request_->text(), eo);
  }

  void OnTokenized(absl::StatusOr<std::vector<int32_t>> ids) {
    if (client_cancelled_ || context_->IsCancelled()) {
      return FinishWith("cancelled", grpc::Status::CANCELLED);
    }
    if (cut_) {
      return FinishWith("unavailable", grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                    "the router's drain deadline passed"));
    }
    if (!ids.ok()) return FinishWith("invalid", ToGrpcStatus(ids.status()));
    prompt_ = std::move(*ids);
    AdmitPrompt();
  }

  // The prompt is token ids now: last checks, then admission.
  void AdmitPrompt() {
    InferenceService* s = service_;
    const GenerateRequest& req = *request_;
    if (prompt_.empty()) {
      return FinishWith("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                "the prompt is empty: give text or token_ids"));
    }
    if (!req.sampling().stop().empty() && !s->tokenizer_) {
      return FinishWith("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                "stop strings need a tokenizer on the router"));
    }
    // Admission: a slot now, or a place in this priority's queue (bounded)
    // until one frees, the wait's deadline passes or the client cancels.
    absl::Time queue_deadline = absl::Now() + s->options_.max_queue_wait;
    if (context_->deadline() != std::chrono::system_clock::time_point::max()) {
      queue_deadline = std::min(queue_deadline, absl::FromChrono(context_->deadline()));
    }
    phase_ = Phase::kAdmission;
    admission_pending_ = true;
    // The verdict comes back as an event: at once (queued behind this one),
    // or later from the thread that frees a slot, the deadline thread, or
    // CancelWait in OnClientCancel.
    wait_id_ = s->admission_.AdmitAsync(ToPriority(req.priority()), queue_deadline,
                                        [this](absl::StatusOr<router::AdmissionTicket> ticket) {
                                          Event e{Event::kAdmitted};
                                          e.ticket = std::move(ticket);
                                          Post(std::move(e));
                                        });
  }

  void OnAdmitted(absl::StatusOr<router::AdmissionTicket> ticket) {
    admission_pending_ = false;
    wait_id_ = 0;
    if (!ticket.ok()) {
      if (cut_) {
        return FinishWith("unavailable", grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                      "the router's drain deadline passed"));
      }
      if (auto hint = router::RetryAfterFromStatus(ticket.status())) {
        context_->AddTrailingMetadata("retry-after-ms",
                                      absl::StrCat(absl::ToInt64Milliseconds(*hint)));
      }
      return FinishWith("rejected", ToGrpcStatus(ticket.status()));
    }
    ticket_ = std::move(*ticket);
    if (cut_) {
      return FinishWith("unavailable", grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                    "the router's drain deadline passed"));
    }
    metrics()->in_flight.Increment();
    counted_in_flight_ = true;

    const GenerateRequest& req = *request_;
    // One worker request template; generated_ids grow with migrations.
    wreq_.set_request_id(req.request_id());
    for (int32_t t : prompt_) wreq_.add_prompt_ids(t);
    *wreq_.mutable_sampling() = req.sampling();
    wreq_.mutable_sampling()->clear_stop();  // stop strings are the router's job
    wreq_.set_priority(req.priority());
    // Retry and migration bookkeeping: tokens delivered so far, workers
    // tried, the seed that keeps a migrated request's random stream.
    router::RetryOptions retry_options;
    retry_options.max_attempts = service_->options_.max_attempts;
    attempts_.emplace(
        retry_options, prompt_,
        req.sampling().has_max_tokens() ? req.sampling().max_tokens()
                                        : std::numeric_limits<int32_t>::max(),
        req.sampling().has_seed() ? std::optional<uint64_t>(req.sampling().seed()) : std::nullopt);
    wreq_.mutable_sampling()->set_seed(attempts_->seed());
    if (service_->tokenizer_) {
      detok_.emplace(service_->tokenizer_.get(), !req.keep_special_tokens());
    }
    stop_matcher_.emplace(
        std::vector<std::string>(req.sampling().stop().begin(), req.sampling().stop().end()));
    complete_.set_request_id(req.request_id());
    phase_ = Phase::kStreaming;
    StartAttempt();
  }

  // Routes and starts the next worker call, or finishes the request.
  void StartAttempt() {
    router::Router* router = service_->router_;
    for (;;) {
      if (client_cancelled_ || context_->IsCancelled()) {
        return FinishWith("cancelled", grpc::Status::CANCELLED);
      }
      if (cut_) return CompleteCut();
      // Route over everything the worker will prefill.
      router::RouteRequest rr;
      rr.token_ids = attempts_->routing_tokens();
      rr.routing_key = request_->routing_key();
      rr.priority = ToPriority(request_->priority());
      rr.exclude = attempts_->tried_workers();
      absl::Time route_start = absl::Now();
      absl::StatusOr<router::RouteDecision> decision = router->RouteAndAssign(rr);
      metrics()->route_decision.Observe(absl::ToDoubleSeconds(absl::Now() - route_start));
      if (!decision.ok()) {
        last_error_ = ToGrpcStatus(decision.status());
        return FinishUnavailable();
      }
      const bool resumed = !attempts_->generated_ids().empty();
      if (attempts_->attempts() > 0) {
        (resumed ? metrics()->migrations : metrics()->retries).Increment();
      }
      attempts_->OnAttemptStarted(decision->worker_id);
      tessera::v1::Worker::Stub* stub = service_->StubFor(decision->worker_id);
      if (stub == nullptr) {  // removed from the worker list meanwhile
        router->OnFinished(*decision);
        router::RetryVerdict v = attempts_->OnAttemptFailed(
            {absl::UnavailableError("worker removed"), router::UpstreamErrorKind::kConnectFailure});
        if (v.step == router::NextStep::kFail) {
          last_error_ = ToGrpcStatus(v.status);
          return FinishUnavailable();
        }
        continue;
      }
      metrics()->prefix_hit_tokens.Increment(decision->cached_tokens);

      wreq_.clear_generated_ids();
      for (int32_t t : attempts_->generated_ids()) wreq_.add_generated_ids(t);
      decision_ = std::move(*decision);
      first_message_ = true;
      worker_over_ = false;
      worker_done_pending_ = false;
      // The client's deadline follows the worker call. Its cancellation does
      // not propagate by itself: OnClientCancel cancels the worker call, so a
      // CANCELLED ending is known to be the client's (never taken for a
      // worker going away, retried or migrated) whichever reaction comes
      // first.
      worker_ = std::make_unique<WorkerCall>(
          grpc::ClientContext::FromCallbackServerContext(
              *context_, grpc::PropagationOptions().disable_cancellation_propagation()),
          wreq_,
          [this](bool ok) {
            Event e{Event::kWorkerRead};
            e.ok = ok;
            Post(std::move(e));
          },
          [this](grpc::Status status) {
            Event e{Event::kWorkerDone};
            e.status = std::move(status);
            Post(std::move(e));
          });
      worker_->Start(stub);
      return;
    }
  }

  void CancelWorker() {
    if (worker_ != nullptr && !worker_over_) worker_->Cancel();
  }
  // No more reads on the current worker call: its OnDone may come.
  void StopReading() {
    if (worker_ != nullptr) worker_->StopReading();
  }

  // A message of the worker's stream (ok), or its end (!ok: OnDone follows).
  void OnWorkerRead(bool ok) {
    if (!ok) return StopReading();
    if (first_message_) {
      service_->router_->RecordSuccess(decision_->worker_id);
      first_message_ = false;
    }
    if (client_cancelled_ || client_gone_) {
      CancelWorker();  // nothing more goes to the client; wait for the call's end
      StopReading();
      return;
    }
    const WorkerGenerateResponse& wresp = worker_->response();
    matched_.reset();
    if (!wresp.has_chunk()) return AfterMessage();
    GenerateResponse& out = out_;
    out.Clear();
    tessera::v1::Chunk* chunk = out.mutable_chunk();
    // Tokens go through the detokenizer and the stop matcher one by one, so
    // a stop string ends the chunk at the token that completed it.
    std::string text;
    for (int i = 0; i < wresp.chunk().token_ids_size() && !matched_; ++i) {
      int32_t t = wresp.chunk().token_ids(i);
      attempts_->OnTokens(absl::MakeConstSpan(&t, 1));
      chunk->add_token_ids(t);
      if (i < wresp.chunk().logprobs_size()) *chunk->add_logprobs() = wresp.chunk().logprobs(i);
      if (!detok_) continue;
      auto delta = detok_->Add(t);
      if (!delta.ok()) continue;
      router::StopStringMatcher::Result r = stop_matcher_->Add(*delta);
      text += r.text;
      matched_ = r.matched;
    }
    chunk->set_text(text);
    absl::Time now = absl::Now();
    if (!last_token_time_) {
      metrics()->ttft.Observe(absl::ToDoubleSeconds(now - arrival_));
    } else {
      metrics()->inter_token_latency.Observe(absl::ToDoubleSeconds(now - *last_token_time_) /
                                             std::max(1, chunk->token_ids_size()));
    }
    last_token_time_ = now;
    metrics()->generation_tokens.Increment(chunk->token_ids_size());
    write_pending_ = true;
    StartWrite(&out_);
  }

  // The current worker message is through (its chunk written, if any).
  void AfterMessage() {
    const WorkerGenerateResponse& wresp = worker_->response();
    if (matched_) {
      complete_.set_finish_reason(tessera::v1::FINISH_REASON_STOP);
      complete_.set_matched_stop(*matched_);
      CancelWorker();  // the worker stops generating
      done_ = true;
    }
    if (wresp.has_complete()) {
      const tessera::v1::WorkerComplete& wc = wresp.complete();
      complete_.set_finish_reason(wc.finish_reason());
      if (wc.has_stop_token_id()) complete_.set_matched_stop(absl::StrCat(wc.stop_token_id()));
      if (cached_tokens_ < 0) cached_tokens_ = wc.usage().cached_tokens();
      done_ = true;
    }
    if (worker_done_pending_) return OnWorkerDone(std::move(worker_status_));
    if (!done_) return worker_->ReadNext();
    // Done: the worker's stream ends (or was cancelled); OnDone follows.
    StopReading();
  }

  void OnWritten(bool ok) {
    write_pending_ = false;
    switch (phase_) {
      case Phase::kStreaming:
        if (!ok) {
          // The client went away: stop the worker, then finish.
          client_gone_ = true;
          CancelWorker();
          StopReading();
          if (worker_done_pending_) OnWorkerDone(std::move(worker_status_));
          return;
        }
        AfterMessage();
        return;
      case Phase::kTail:
        SendComplete();
        return;
      default:
        return;
    }
  }

  // The drain deadline passed: stop the worker and end with a final
  // message (finish reason CANCELLED, usage so far) instead of the server's
  // cancellation; a request not streaming yet gets UNAVAILABLE.
  void OnCut() {
    if (phase_ == Phase::kFinished || cut_) return;
    cut_ = true;
    if (admission_pending_ && wait_id_ != 0) service_->admission_.CancelWait(wait_id_);
    CancelWorker();
  }

  void OnClientCancel() {
    client_cancelled_ = true;
    // Leave the admission queue (the verdict, CANCELLED, comes back as an
    // event); if the wait already ended, its verdict is on its way.
    if (admission_pending_ && wait_id_ != 0) service_->admission_.CancelWait(wait_id_);
    CancelWorker();
  }

  // The worker call ended (all its reactions are over).
  void OnWorkerDone(grpc::Status s) {
    worker_over_ = true;
    if (write_pending_) {  // finish the message being written first
      worker_status_ = std::move(s);
      worker_done_pending_ = true;
      return;
    }
    worker_done_pending_ = false;
    const bool first = first_message_;
    const std::string worker_id = decision_->worker_id;
    router::Router* router = service_->router_;
    router->OnFinished(*decision_);
    decision_.reset();
    worker_.reset();
    if (client_gone_) {
      return FinishWith("cancelled", grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    }
    if (done_) return Complete();
    if (client_cancelled_ || context_->IsCancelled()) {
      return FinishWith("cancelled", grpc::Status::CANCELLED);
    }
    if (cut_) return CompleteCut();
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
    if (router::CountsAsWorkerFailure(error)) router->RecordFailure(worker_id);
    router::RetryVerdict verdict = attempts_->OnAttemptFailed(error);
    if (verdict.step == router::NextStep::kComplete) {
      complete_.set_finish_reason(tessera::v1::FINISH_REASON_LENGTH);
      done_ = true;
      return Complete();
    }
    if (verdict.step == router::NextStep::kFail) {
      // A request error (e.g. INVALID_ARGUMENT) is the client's to see.
      grpc::Status status = ToGrpcStatus(verdict.status);
      if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        return FinishWith("invalid", status);
      }
      last_error_ = status;
      return FinishUnavailable();
    }
    LogWarning(verdict.step == router::NextStep::kRetry ? "retrying on another worker"
                                                        : "migrating to another worker",
               {{"worker", worker_id},
                {"error", s.error_message()},
                {"tokens_sent", static_cast<int64_t>(attempts_->generated_ids().size())}});
    last_error_ = ToGrpcStatus(error.status);
    StartAttempt();
  }

  // Ended by the router's drain deadline, with the tokens sent so far.
  void CompleteCut() {
    complete_.set_finish_reason(tessera::v1::FINISH_REASON_CANCELLED);
    done_ = true;
    Complete();
  }

  // Generation is over: the text held back, then Complete with usage.
  void Complete() {
    // Text held back by the detokenizer or the stop matcher.
    if (detok_ && !stop_matcher_->matched()) {
      std::string rest = stop_matcher_->Add(detok_->Finish()).text + stop_matcher_->Finish();
      if (!rest.empty()) {
        out_.Clear();
        out_.mutable_chunk()->set_text(rest);
        phase_ = Phase::kTail;
        write_pending_ = true;
        StartWrite(&out_);
        return;  // SendComplete when written
      }
    }
    SendComplete();
  }

  void SendComplete() {
    tessera::v1::Usage* usage = complete_.mutable_usage();
    usage->set_prompt_tokens(static_cast<int32_t>(prompt_.size()));
    usage->set_completion_tokens(static_cast<int32_t>(attempts_->generated_ids().size()));
    usage->set_cached_tokens(std::max(0, cached_tokens_));
    metrics()->prompt_tokens.Increment(prompt_.size());
    out_.Clear();
    *out_.mutable_complete() = complete_;
    metrics()->e2e.Observe(absl::ToDoubleSeconds(absl::Now() - arrival_));
    metrics()->Request(cut_ ? "drain_cut" : "ok");
    phase_ = Phase::kFinished;
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    ReleaseSlot();
  }

  // No worker could take (or finish) the request.
  void FinishUnavailable() {
    if (last_error_.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      context_->AddTrailingMetadata("retry-after-ms", "200");
    }
    FinishWith("unavailable", last_error_);
  }

  // REQUIRES: no worker call alive, no admission verdict outstanding, no
  // write pending.
  void FinishWith(const std::string& outcome, grpc::Status status) {
    metrics()->Request(outcome);
    phase_ = Phase::kFinished;
    Finish(std::move(status));
    ReleaseSlot();
  }

  // Gives the admission slot to the next waiter (whose verdict may run on
  // this thread, after this event) and leaves the in-flight gauge.
  void ReleaseSlot() {
    if (counted_in_flight_) {
      metrics()->in_flight.Decrement();
      counted_in_flight_ = false;
    }
    ticket_.Release();
  }

  InferenceService* const service_;
  grpc::CallbackServerContext* const context_;
  const GenerateRequest* const request_;  // valid until OnDone
  const size_t request_bytes_;
  const absl::Time arrival_;

  std::mutex mu_;  // guards events_, running_ and dying_
  // events_: posted, not yet handled. call_done_ is written by the handling
  // thread and read by it after the queue ran dry.
  std::deque<Event> events_;
  bool running_ = false;
  bool call_done_ = false;
  bool dying_ = false;  // the queue ran dry after OnDone: deleted next

  // Below: touched only by the event being handled.
  Phase phase_ = Phase::kAdmission;
  std::unique_ptr<WorkGuard> guard_;  // released when the object goes
  std::vector<int32_t> prompt_;
  bool admission_pending_ = false;
  uint64_t wait_id_ = 0;
  router::AdmissionTicket ticket_;
  bool counted_in_flight_ = false;
  WorkerGenerateRequest wreq_;
  std::optional<router::RequestAttempts> attempts_;
  std::optional<IncrementalDetokenizer> detok_;
  std::optional<router::StopStringMatcher> stop_matcher_;
  tessera::v1::Complete complete_;
  int cached_tokens_ = -1;
  std::optional<absl::Time> last_token_time_;
  bool done_ = false;  // generation complete (Complete or a stop string)
  grpc::Status last_error_{grpc::StatusCode::UNAVAILABLE, "no worker could take the request"};
  bool client_cancelled_ = false;
  bool client_gone_ = false;  // a write to the client failed
  bool cut_ = false;          // the router's drain deadline passed

  // The current attempt.
  std::optional<router::RouteDecision> decision_;
  std::unique_ptr<WorkerCall> worker_;
  bool first_message_ = true;
  bool worker_over_ = false;          // its OnDone ran
  bool worker_done_pending_ = false;  // it ended while a write was pending
  grpc::Status worker_status_;
  std::optional<std::string> matched_;  // the stop string the message completed

  // The message being written (valid until its write completes).
  GenerateResponse out_;
  bool write_pending_ = false;
};

void InferenceService::CutOpenStreams() {
  // Enqueue under the lock, run outside it: a call is deleted only by the
  // thread that runs its queue, and its destructor takes calls_mu_.
  std::vector<GenerateCall*> to_run;
  {
    absl::MutexLock lock(&calls_mu_);
    for (GenerateCall* call : calls_) {
      if (call->EnqueueCut()) to_run.push_back(call);
    }
  }
  for (GenerateCall* call : to_run) call->Run();
}

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  return new GenerateCall(this, context, request);
}

grpc::Status InferenceService::Tokenize(grpc::ServerContext* context,
                                        const tessera::v1::TokenizeRequest* req,
                                        tessera::v1::TokenizeResponse* resp) {
  if (grpc::Status s = Authenticate(*context); !s.ok()) return s;
  if (grpc::Status s = CheckModel(req->model()); !s.ok()) return s;
  if (!tokenizer_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this router has no tokenizer (--tokenizer)");
  }
  if (grpc::Status s = CheckPromptBytes(req->text().size()); !s.ok()) return s;
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
