#include "services/router/openai_handler.h"

#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "services/common/status.h"
#include "services/router/stream_pipeline.h"

namespace tessera::services {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

void RespondError(HttpExchange& exchange, const ApiError& error, HttpHeaders headers = {}) {
  exchange.Respond(error.http_status, kJson, ErrorJson(error), std::move(headers));
}

std::string RandomId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%016x", rng());
}

// One HTTP request: its choices' pipelines, and what goes back to the
// client. Shared by the choices' sinks; lives until the last one goes.
class HttpCompletion : public std::enable_shared_from_this<HttpCompletion> {
 public:
  HttpCompletion(ApiRequest request, std::shared_ptr<HttpExchange> exchange,
                 const Tokenizer* tokenizer)
      : request_(std::move(request)),
        exchange_(std::move(exchange)),
        writer_(request_, absl::StrCat(request_.chat ? "chatcmpl-" : "cmpl-", RandomId()),
                tokenizer),
        choices_(request_.choices()) {}

  void Start(InferenceService* service);

  // From the choices' sinks (the pipelines' event threads).
  void OnMessage(int index, const tessera::v1::GenerateResponse& message);
  void OnFinal(int index, const tessera::v1::GenerateResponse& message);
  void OnFail(int index, const StreamError& error);

 private:
  struct ChoiceState {
    StreamPipeline* pipeline = nullptr;
    bool ended = false;  // its sink got the final call
    bool cancel_sent = false;
    int pins = 0;  // OnCancel calls in progress
    bool done_deferred = false;
  };

  // Cancels every choice still running (except `except`), e.g. when the
  // client went away or one choice failed.
  void CancelOthers(int except);
  // The choice's sink is through: OnDone, now or after a cancel in progress.
  void EndChoice(int index);
  void StartStreamLocked();

  ApiRequest request_;
  std::shared_ptr<HttpExchange> exchange_;
  std::mutex mu_;
  ResponseWriter writer_;  // guarded by mu_
  std::vector<ChoiceState> choices_;
  int finished_ = 0;
  bool stream_started_ = false;
  bool answered_ = false;  // a response (or the stream's end) went out
};

// The StreamSink of one choice.
class ChoiceSink final : public StreamSink {
 public:
  ChoiceSink(std::shared_ptr<HttpCompletion> owner, int index)
      : owner_(std::move(owner)), index_(index) {}
  void Write(const tessera::v1::GenerateResponse& message) override {
    owner_->OnMessage(index_, message);
  }
  void WriteLastAndFinish(const tessera::v1::GenerateResponse& message) override {
    owner_->OnFinal(index_, message);
  }
  void Fail(const StreamError& error) override { owner_->OnFail(index_, error); }

 private:
  std::shared_ptr<HttpCompletion> owner_;
  const int index_;
};

void HttpCompletion::Start(InferenceService* service) {
  const int n = request_.n;
  for (int i = 0; i < request_.choices(); ++i) {
    StreamRequest sr;
    if (request_.chat) {
      sr = service->ChatToStream(request_.chat_request);
    } else {
      sr = InferenceService::GenerateToStream(request_.prompts[i / n]);
    }
    sr.request_id = absl::StrCat(RandomId(), "-", i);
    if (sr.sampling.has_seed()) sr.sampling.set_seed(sr.sampling.seed() + i % n);
    if (sr.output_parser && sr.output_parser->id_seed != 0) sr.output_parser->id_seed += i;
    choices_[i].pipeline = StreamPipeline::Create(
        service, std::move(sr), std::make_unique<ChoiceSink>(shared_from_this(), i));
  }
  // A client that goes away cancels the request.
  std::weak_ptr<HttpCompletion> weak = weak_from_this();
  exchange_->OnClientClose([weak] {
    if (auto self = weak.lock()) self->CancelOthers(-1);
  });
  // Pointers taken first: a pipeline may end (and go) as soon as it starts.
  std::vector<StreamPipeline*> pipelines;
  for (const ChoiceState& c : choices_) pipelines.push_back(c.pipeline);
  auto keep = shared_from_this();
  for (StreamPipeline* p : pipelines) p->Start();
}

void HttpCompletion::StartStreamLocked() {
  if (stream_started_) return;
  stream_started_ = true;
  exchange_->StartStream(200, "text/event-stream");
}

void HttpCompletion::OnMessage(int index, const tessera::v1::GenerateResponse& message) {
  StreamPipeline* pipeline;
  std::string event;
  bool ok = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pipeline = choices_[index].pipeline;
    ok = !answered_;
    if (!answered_) {
      if (request_.stream) {
        event = writer_.ChunkEvent(index, message.chunk());
        if (!event.empty()) StartStreamLocked();
      } else {
        writer_.Accumulate(index, message.chunk());
      }
    }
  }
  if (event.empty()) return pipeline->OnWriteDone(ok);
  exchange_->Write(std::move(event), [pipeline](bool ok) { pipeline->OnWriteDone(ok); });
}

void HttpCompletion::OnFinal(int index, const tessera::v1::GenerateResponse& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    const bool last = finished_ == static_cast<int>(choices_.size());
    if (!answered_) {
      if (request_.stream) {
        StartStreamLocked();
        std::string events = writer_.FinishEvent(index, message.complete());
        if (last) events += writer_.EndEvents();
        exchange_->Write(std::move(events), nullptr);
        if (last) {
          exchange_->EndStream();
          answered_ = true;
        }
      } else {
        writer_.AccumulateFinish(index, message.complete());
        if (last) {
          exchange_->Respond(200, kJson, writer_.ResponseBody());
          answered_ = true;
        }
      }
    }
  }
  EndChoice(index);
}

void HttpCompletion::OnFail(int index, const StreamError& error) {
  bool cancel = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    if (!answered_) {
      answered_ = true;
      cancel = true;
      ApiError api = ErrorFromStatus(error.status, error.code);
      if (stream_started_) {
        exchange_->Write(ResponseWriter::ErrorEvent(api), nullptr);
        exchange_->EndStream();
      } else {
        HttpHeaders headers;
        if (error.retry_after) {
          const int64_t seconds = std::max<int64_t>(
              1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(*error.retry_after))));
          headers.emplace_back("Retry-After", absl::StrCat(seconds));
        }
        RespondError(*exchange_, api, std::move(headers));
      }
    }
  }
  if (cancel) CancelOthers(index);
  EndChoice(index);
}

void HttpCompletion::CancelOthers(int except) {
  auto keep = shared_from_this();
  std::vector<int> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < static_cast<int>(choices_.size()); ++i) {
      ChoiceState& c = choices_[i];
      if (i == except || c.ended || c.cancel_sent) continue;
      c.cancel_sent = true;
      ++c.pins;
      targets.push_back(i);
    }
  }
  for (int i : targets) choices_[i].pipeline->OnCancel();
  std::vector<StreamPipeline*> to_done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i : targets) {
      ChoiceState& c = choices_[i];
      if (--c.pins == 0 && c.done_deferred) to_done.push_back(c.pipeline);
    }
  }
  for (StreamPipeline* p : to_done) p->OnDone();
}

void HttpCompletion::EndChoice(int index) {
  StreamPipeline* now = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ChoiceState& c = choices_[index];
    c.ended = true;
    if (c.pins > 0) {
      c.done_deferred = true;
    } else {
      now = c.pipeline;
    }
  }
  if (now != nullptr) now->OnDone();
}

}  // namespace

void OpenAiHandler::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  const std::string& path = request.path;
  const bool post = request.method == "POST";
  const bool get = request.method == "GET" || request.method == "HEAD";
  auto method_not_allowed = [&](const char* allow) {
    ApiError e;
    e.http_status = 405;
    e.message = absl::StrCat(request.method, " is not allowed on ", path, "; use ", allow);
    RespondError(*exchange, e, {{"Allow", allow}});
  };
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (!post) return method_not_allowed("POST");
    return Complete(std::move(request), std::move(exchange), path == "/v1/chat/completions");
  }
  if (path == "/v1/models") {
    if (!get) return method_not_allowed("GET");
    return ListModels(request, *exchange);
  }
  if (path == "/health") {
    if (!get) return method_not_allowed("GET");
    return Health(*exchange);
  }
  ApiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.message = absl::StrCat("no route ", request.method, " ", path.substr(0, 200),
                           "; served: POST /v1/chat/completions, POST /v1/completions, "
                           "GET /v1/models, GET /health");
  RespondError(*exchange, e);
}

void OpenAiHandler::ListModels(const HttpRequest& request, HttpExchange& exchange) {
  if (absl::Status s = service_->CheckApiKey(request.Header("authorization")); !s.ok()) {
    return RespondError(exchange, ErrorFromStatus(ToGrpcStatus(s)));
  }
  json model = {{"id", service_->model_name()},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "tessera"},
                {"max_model_len", service_->context_length()}};
  json body = {{"object", "list"}, {"data", json::array({model})}};
  exchange.Respond(200, kJson, body.dump());
}

void OpenAiHandler::Health(HttpExchange& exchange) {
  const int healthy = service_->HealthyWorkers();
  const bool ok = healthy > 0 && !service_->draining();
  json body = {{"status", ok ? "ok" : (service_->draining() ? "draining" : "no_healthy_worker")},
               {"healthy_workers", healthy}};
  exchange.Respond(ok ? 200 : 503, kJson, body.dump());
}

void OpenAiHandler::Complete(HttpRequest request, std::shared_ptr<HttpExchange> exchange,
                             bool chat) {
  if (absl::Status s = service_->CheckApiKey(request.Header("authorization")); !s.ok()) {
    return RespondError(*exchange, ErrorFromStatus(ToGrpcStatus(s)));
  }
  ApiRequest api;
  if (std::optional<ApiError> e = ParseApiRequest(request.body, chat, limits_, &api)) {
    return RespondError(*exchange, *e);
  }
  auto completion =
      std::make_shared<HttpCompletion>(std::move(api), std::move(exchange), service_->tokenizer());
  completion->Start(service_);
}

}  // namespace tessera::services
