#include "services/router/stream_pipeline.h"

#include <malloc.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "router/retry.h"
#include "services/common/drain.h"
#include "services/common/sampling_convert.h"
#include "services/common/status.h"
#include "services/router/inference_service.h"
#include "text/stop_strings.h"
#include "text/tokenizer/incremental_detokenizer.h"

namespace tessera::services {
namespace {

using tessera::v1::GenerateResponse;
using tessera::v1::WorkerGenerateRequest;
using tessera::v1::WorkerGenerateResponse;

// Texts longer than this are tokenized on the TokenizePool (about a
// millisecond of work inline).
constexpr size_t kInlineTokenizeBytes = 64 << 10;
// Requests at least this large trim the allocator when they end.
constexpr size_t kTrimAfterBytes = 1 << 20;

// The worker side of one attempt: a server-streaming call on the callback
// API. It only forwards its reactions to the pipeline that owns it.
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
  bool held_ = true;  // touched only by the owning pipeline's events
};

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

void AddParsed(const text::ParsedDelta& d, tessera::v1::Chunk* chunk) {
  chunk->mutable_text()->append(d.content);
  chunk->mutable_reasoning()->append(d.reasoning);
  for (const text::ToolCallDelta& t : d.tool_calls) {
    tessera::v1::ToolCallDelta* out = chunk->add_tool_calls();
    out->set_index(t.index);
    out->set_id(t.id);
    out->set_name(t.name);
    out->set_arguments(t.arguments);
  }
}

}  // namespace

namespace internal {

// The pipeline (see the header). Lifetime: the sink is ended only when no
// worker call is alive, no admission verdict is outstanding and no write is
// pending; OnDone is then the last event, and the object deletes itself
// after handling it.
//
// Backpressure: one write to the client and one read from the worker at a
// time; the next worker message is read only after the client's write of
// the previous one completed.
class Pipeline final : public StreamPipeline {
 public:
  Pipeline(InferenceService* service, StreamRequest request, std::unique_ptr<StreamSink> sink)
      : service_(service),
        request_(std::move(request)),
        sink_(std::move(sink)),
        request_bytes_(request_.text.size() + request_.token_ids.size() * 4),
        arrival_(absl::Now()) {
    absl::MutexLock lock(&service_->calls_mu_);
    service_->calls_.insert(this);
  }
  ~Pipeline() override {
    {
      absl::MutexLock lock(&service_->calls_mu_);
      service_->calls_.erase(this);
    }
    // A large request leaves its receive buffers free in the allocator's
    // arenas; hand them back to the system instead of keeping them.
    if (request_bytes_ >= kTrimAfterBytes) malloc_trim(0);
  }

  void Start() override { Post(Event{Event::kStart}); }
  void OnWriteDone(bool ok) override {
    Event e{Event::kWriteDone};
    e.ok = ok;
    Post(std::move(e));
  }
  void OnCancel() override { Post(Event{Event::kCancel}); }
  void OnDone() override { Post(Event{Event::kDone}); }
  bool EnqueueCut() override { return Enqueue(Event{Event::kCut}); }
  void RunQueue() override {
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
    if (Enqueue(std::move(e))) RunQueue();
  }
  // True when the queue was idle: the caller now runs it (RunQueue).
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
        Begin();
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
  bool Cancelled() const { return client_cancelled_ || absl::Now() >= request_.deadline; }

  // Validation, tokenization, then admission.
  void Begin() {
    InferenceService* s = service_;
    if (!request_.early_error.ok()) {
      return FinishWith(request_.early_outcome, ToGrpcStatus(request_.early_error));
    }
    guard_ = std::make_unique<WorkGuard>(s->drain_);
    if (!guard_->ok()) {
      return FinishWith("unavailable",
                        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     "router is draining and accepts no new requests"));
    }
    const StreamRequest& req = request_;
    if (grpc::Status st = s->CheckModel(req.model); !st.ok()) return FinishWith("invalid", st);
    if (absl::Status st = CheckKnownSamplingFields(req.sampling); !st.ok()) {
      return FinishWith("invalid", ToGrpcStatus(st));
    }
    if (!req.has_text) {
      prompt_ = req.token_ids;
      return AdmitPrompt();
    }
    if (!s->tokenizer_) {
      return FinishWith("invalid", grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                                "this router has no tokenizer (--tokenizer): "
                                                "send token_ids instead of text"));
    }
    if (grpc::Status st = s->CheckPromptBytes(req.text.size()); !st.ok()) {
      return FinishWith("invalid", st);
    }
    if (req.text.size() > kInlineTokenizeBytes) {
      // A long text is tokenized on the pool; the result comes back as an
      // event.
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
    AdmitPrompt();
  }

  absl::StatusOr<std::vector<int32_t>> Tokenize() const {
    EncodeOptions eo;
    eo.add_special_tokens = request_.add_special_tokens;
    return service_->tokenizer_->Encode(request_.text, eo);
  }

  void OnTokenized(absl::StatusOr<std::vector<int32_t>> ids) {
    if (Cancelled()) return FinishWith("cancelled", grpc::Status::CANCELLED);
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
    const StreamRequest& req = request_;
    if (prompt_.empty()) {
      return FinishWith("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                "the prompt is empty: give text or token_ids"));
    }
    if (!req.sampling.stop().empty() && !s->tokenizer_) {
      return FinishWith("invalid", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                "stop strings need a tokenizer on the router"));
    }
    // The prompt plus at least one token (or max_tokens) must fit in the
    // context; refused here with a reason clients can act on.
    const int64_t context = s->context_length_.load();
    const int64_t wanted = req.sampling.has_max_tokens() ? req.sampling.max_tokens() : 1;
    if (context > 0 &&
        static_cast<int64_t>(prompt_.size()) + std::max<int64_t>(1, wanted) > context) {
      StreamError error;
      const int64_t room = context - static_cast<int64_t>(prompt_.size());
      error.status = grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          room < 1 ? absl::StrCat("the prompt (", prompt_.size(),
                                  " tokens) fills the model's context of ", context,
                                  " tokens: no room for output")
                   : absl::StrCat("max_tokens is ", wanted, " but the context (", context,
                                  " tokens) leaves room for ", room, " tokens after this prompt (",
                                  prompt_.size(), " tokens)"));
      error.code = "context_length_exceeded";
      return FailWith("invalid", std::move(error));
    }
    // Admission: a slot now, or a place in this priority's queue (bounded)
    // until one frees, the wait's deadline passes or the client cancels.
    absl::Time queue_deadline =
        std::min(absl::Now() + s->options_.max_queue_wait, request_.deadline);
    phase_ = Phase::kAdmission;
    admission_pending_ = true;
    // The verdict comes back as an event: at once (queued behind this one),
    // or later from the thread that frees a slot, the deadline thread, or
    // CancelWait in OnClientCancel.
    wait_id_ = s->admission_.AdmitAsync(ToPriority(req.priority), queue_deadline,
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
      StreamError error;
      error.status = ToGrpcStatus(ticket.status());
      error.retry_after = router::RetryAfterFromStatus(ticket.status());
      return FailWith("rejected", std::move(error));
    }
    ticket_ = std::move(*ticket);
    if (cut_) {
      return FinishWith("unavailable", grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                    "the router's drain deadline passed"));
    }
    metrics()->in_flight.Increment();
    counted_in_flight_ = true;

    const StreamRequest& req = request_;
    // One worker request template; generated_ids grow with migrations.
    wreq_.set_request_id(req.request_id);
    for (int32_t t : prompt_) wreq_.add_prompt_ids(t);
    *wreq_.mutable_sampling() = req.sampling;
    wreq_.mutable_sampling()->clear_stop();  // stop strings are the router's job
    wreq_.set_priority(req.priority);
    // Retry and migration bookkeeping: tokens delivered so far, workers
    // tried, the seed that keeps a migrated request's random stream.
    router::RetryOptions retry_options;
    retry_options.max_attempts = service_->options_.max_attempts;
    attempts_.emplace(
        retry_options, prompt_,
        req.sampling.has_max_tokens() ? req.sampling.max_tokens()
                                      : std::numeric_limits<int32_t>::max(),
        req.sampling.has_seed() ? std::optional<uint64_t>(req.sampling.seed()) : std::nullopt);
    wreq_.mutable_sampling()->set_seed(attempts_->seed());
    if (service_->tokenizer_) {
      detok_.emplace(service_->tokenizer_.get(), !req.keep_special_tokens);
    }
    stop_matcher_.emplace(
        std::vector<std::string>(req.sampling.stop().begin(), req.sampling.stop().end()));
    if (req.output_parser && detok_) {
      auto parser = text::MakeOutputParser(*req.output_parser);
      if (!parser.ok()) return FinishWith("invalid", ToGrpcStatus(parser.status()));
      parser_ = std::move(*parser);
    }
    complete_.set_request_id(req.request_id);
    phase_ = Phase::kStreaming;
    StartAttempt();
  }

  // Routes and starts the next worker call, or finishes the request.
  void StartAttempt() {
    router::Router* router = service_->router_;
    for (;;) {
      if (Cancelled()) return FinishWith("cancelled", grpc::Status::CANCELLED);
      if (cut_) return CompleteCut();
      // Route over everything the worker will prefill.
      router::RouteRequest rr;
      rr.token_ids = attempts_->routing_tokens();
      rr.routing_key = request_.routing_key;
      rr.priority = ToPriority(request_.priority);
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
      // The client's deadline follows the worker call. Its cancellation
      // reaches the worker through OnClientCancel, which cancels the call,
      // so a CANCELLED ending is known to be the client's (never taken for
      // a worker going away, retried or migrated).
      auto context = std::make_unique<grpc::ClientContext>();
      if (request_.deadline != absl::InfiniteFuture()) {
        context->set_deadline(absl::ToChronoTime(request_.deadline));
      }
      worker_ = std::make_unique<WorkerCall>(
          std::move(context), wreq_,
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
    out_.Clear();
    tessera::v1::Chunk* chunk = out_.mutable_chunk();
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
    if (parser_) {
      AddParsed(parser_->Feed(text), chunk);
    } else {
      chunk->set_text(text);
    }
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
    sink_->Write(out_);
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
        if (!ok)
          return FinishWith("cancelled",
                            grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
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
    if (phase_ == Phase::kFinished) return;
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
    if (Cancelled()) {
      return FinishWith("cancelled", client_cancelled_
                                         ? grpc::Status::CANCELLED
                                         : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                                        "the request's deadline passed"));
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
        StreamError e;
        e.status = status;
        if (absl::StrContains(status.error_message(), "context")) {
          e.code = "context_length_exceeded";
        }
        return FailWith("invalid", std::move(e));
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

  // Generation is over: the text held back, then the final message.
  void Complete() {
    // Text held back by the detokenizer, the stop matcher or the parser.
    out_.Clear();
    tessera::v1::Chunk* chunk = out_.mutable_chunk();
    if (detok_ && !stop_matcher_->matched()) {
      std::string rest = stop_matcher_->Add(detok_->Finish()).text + stop_matcher_->Finish();
      if (parser_) {
        AddParsed(parser_->Feed(rest), chunk);
      } else {
        chunk->set_text(rest);
      }
    }
    if (parser_) AddParsed(parser_->Finish(), chunk);
    if (!chunk->text().empty() || !chunk->reasoning().empty() || chunk->tool_calls_size() > 0) {
      phase_ = Phase::kTail;
      write_pending_ = true;
      sink_->Write(out_);
      return;  // SendComplete when written
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
    sink_->WriteLastAndFinish(out_);
    ReleaseSlot();
  }

  // No worker could take (or finish) the request.
  void FinishUnavailable() {
    StreamError e;
    e.status = last_error_;
    if (last_error_.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      e.retry_after = absl::Milliseconds(200);
    }
    FailWith("unavailable", std::move(e));
  }

  // REQUIRES: no worker call alive, no admission verdict outstanding, no
  // write pending.
  void FinishWith(const std::string& outcome, grpc::Status status) {
    StreamError e;
    e.status = std::move(status);
    FailWith(outcome, std::move(e));
  }
  void FailWith(const std::string& outcome, StreamError error) {
    metrics()->Request(outcome);
    phase_ = Phase::kFinished;
    sink_->Fail(error);
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
  const StreamRequest request_;
  const std::unique_ptr<StreamSink> sink_;
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
  std::unique_ptr<text::OutputParser> parser_;
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

}  // namespace internal

StreamPipeline* StreamPipeline::Create(InferenceService* service, StreamRequest request,
                                       std::unique_ptr<StreamSink> sink) {
  return new internal::Pipeline(service, std::move(request), std::move(sink));
}

}  // namespace tessera::services
