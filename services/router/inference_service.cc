#include "services/router/inference_service.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "services/common/status.h"
#include "services/router/request_checks.h"

namespace tessera::services {
namespace {

using tessera::v1::GenerateRequest;
using tessera::v1::GenerateResponse;

// Constant-time comparison of two strings of possibly different lengths.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

InferenceService::InferenceService(InferenceServiceOptions options, router::Router* router,
                                   std::unique_ptr<Tokenizer> tokenizer, DrainState* drain,
                                   RouterMetrics* metrics, std::unique_ptr<ChatRenderer> chat)
    : options_(std::move(options)),
      router_(router),
      tokenizer_(std::move(tokenizer)),
      chat_(std::move(chat)),
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

absl::Status InferenceService::CheckApiKey(absl::string_view authorization) const {
  if (options_.api_keys.empty()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing API key: send the header 'Authorization: Bearer <key>'");
  }
  const absl::string_view prefix = "Bearer ";
  const std::string key(absl::StartsWith(authorization, prefix)
                            ? authorization.substr(prefix.size())
                            : absl::string_view());
  bool ok = false;
  for (const std::string& k : options_.api_keys) ok |= SameSecret(key, k);  // no early exit
  if (!ok) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

grpc::Status InferenceService::Authenticate(const grpc::ServerContextBase& context) const {
  auto it = context.client_metadata().find("authorization");
  const absl::string_view value = it == context.client_metadata().end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size());
  return ToGrpcStatus(CheckApiKey(value));
}

int InferenceService::HealthyWorkers() const {
  int healthy = 0;
  for (const router::WorkerReport& w : router_->Report())
    healthy += w.status.unroutable == router::Unroutable::kNone ? 1 : 0;
  return healthy;
}

grpc::Status InferenceService::CheckPromptBytes(size_t bytes) const {
  return ToGrpcStatus(services::CheckPromptBytes(bytes, options_.max_prompt_bytes,
                                                 context_length_.load(), tokenizer_.get()));
}

grpc::Status InferenceService::CheckModel(const std::string& model) const {
  return ToGrpcStatus(CheckModelName(model, options_.model_name));
}

// --- Generate and Chat: a pipeline whose sink is a gRPC reactor -------------

namespace {

// The gRPC transport of one stream: the pipeline's sink, and the reactor
// whose reactions it forwards to the pipeline.
class GrpcStream final : public grpc::ServerWriteReactor<GenerateResponse>, public StreamSink {
 public:
  explicit GrpcStream(grpc::CallbackServerContext* context) : context_(context) {}
  void Attach(StreamPipeline* pipeline) { pipeline_ = pipeline; }

  // StreamSink
  void Write(const GenerateResponse& message) override { StartWrite(&message); }
  void WriteLastAndFinish(const GenerateResponse& message) override {
    StartWriteAndFinish(&message, grpc::WriteOptions(), grpc::Status::OK);
  }
  void Fail(const StreamError& error) override {
    if (error.retry_after) {
      context_->AddTrailingMetadata("retry-after-ms",
                                    absl::StrCat(absl::ToInt64Milliseconds(*error.retry_after)));
    }
    Finish(error.status);
  }

  // Reactions
  void OnWriteDone(bool ok) override { pipeline_->OnWriteDone(ok); }
  void OnCancel() override { pipeline_->OnCancel(); }
  void OnDone() override { pipeline_->OnDone(); }  // the pipeline deletes this object

 private:
  grpc::CallbackServerContext* const context_;
  StreamPipeline* pipeline_ = nullptr;
};

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  if (context.deadline() == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(context.deadline());
}

}  // namespace

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::StartGrpcStream(
    grpc::CallbackServerContext* context, StreamRequest request) {
  if (grpc::Status st = Authenticate(*context); !st.ok()) {
    request.early_error = FromGrpcStatus(st);
    request.early_outcome = "unauthenticated";
  }
  request.deadline = DeadlineOf(*context);
  auto stream = std::make_unique<GrpcStream>(context);
  GrpcStream* reactor = stream.get();
  StreamPipeline* pipeline = StreamPipeline::Create(this, std::move(request), std::move(stream));
  reactor->Attach(pipeline);
  pipeline->Start();
  return reactor;
}

StreamRequest InferenceService::GenerateToStream(const GenerateRequest& req) {
  StreamRequest out;
  out.request_id = req.request_id();
  out.model = req.model();
  if (req.has_token_ids()) {
    out.token_ids.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
  } else if (req.prompt_case() == GenerateRequest::kText) {
    out.has_text = true;
    out.text = req.text();
  }
  out.add_special_tokens = !req.no_bos();
  out.keep_special_tokens = req.keep_special_tokens();
  out.sampling = req.sampling();
  out.priority = req.priority();
  out.routing_key = req.routing_key();
  return out;
}

StreamRequest InferenceService::ChatToStream(const tessera::v1::ChatRequest& req) const {
  StreamRequest out;
  out.request_id = req.request_id();
  out.model = req.model();
  out.keep_special_tokens = req.keep_special_tokens();
  out.sampling = req.sampling();
  out.priority = req.priority();
  out.routing_key = req.routing_key();
  if (chat_ == nullptr || !tokenizer_) {
    out.early_error = absl::FailedPreconditionError(
        "this router serves no chat template (start it with --tokenizer naming a model "
        "directory whose tokenizer_config.json or chat_template.jinja has one)");
    return out;
  }
  absl::StatusOr<RenderedChat> rendered = chat_->Render(req);
  if (!rendered.ok()) {
    out.early_error = rendered.status();
    return out;
  }
  // As transformers and vLLM do: the rendered text already holds whatever
  // special tokens the template emits (BOS included), so none are added.
  out.has_text = true;
  out.text = std::move(rendered->prompt);
  out.add_special_tokens = false;
  out.output_parser = rendered->parser;
  return out;
}

void InferenceService::CutOpenStreams() {
  // Enqueue under the lock, run outside it: a call is deleted only by the
  // thread that runs its queue, and its destructor takes calls_mu_.
  std::vector<StreamPipeline*> to_run;
  {
    absl::MutexLock lock(&calls_mu_);
    for (StreamPipeline* call : calls_) {
      if (call->EnqueueCut()) to_run.push_back(call);
    }
  }
  for (StreamPipeline* call : to_run) call->RunQueue();
}

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  return StartGrpcStream(context, GenerateToStream(*request));
}

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Chat(
    grpc::CallbackServerContext* context, const tessera::v1::ChatRequest* request) {
  return StartGrpcStream(context, ChatToStream(*request));
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
  const int healthy = HealthyWorkers();
  tessera::v1::ModelInfo* m = resp->add_models();
  m->set_name(options_.model_name);
  m->set_context_length(context_length_.load());
  m->set_healthy_workers(healthy);
  return grpc::Status::OK;
}

}  // namespace tessera::services
