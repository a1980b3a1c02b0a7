// InferenceService: the public tessera.v1.Inference API, the router's text
// layer over the routing core (router/router.h), and the state that the
// HTTP API (openai_handler.h) shares with it: API keys, admission, routing,
// workers, drain and metrics.
//
// Generate and Chat: authenticate (optional API keys) → (Chat: render the
// messages with the model's chat template) → a StreamPipeline
// (stream_pipeline.h: tokenize, admit, route, stream with retries and
// migration, detokenize, stop strings, output parsing) whose sink is a gRPC
// reactor. Failure handling: before the first token, a retryable worker
// failure is retried on another worker; after it, the request migrates — it
// resumes on another worker with the prompt plus the tokens already sent, so
// the client sees one stream with nothing lost or repeated. Client
// cancellation and deadlines propagate to the worker call.
//
// Threading: Generate and Chat are served with gRPC's callback API; each
// stream is a pipeline driven by events that run one at a time per stream
// on whichever thread delivered them. No thread is held while a stream
// waits for admission, for a worker's token or for the client, so the
// router runs thousands of streams on a handful of threads. Tokenize and
// ListModels are unary synchronous handlers.
//
// Thread-safety: gRPC calls the handlers from its threads; shared state is
// the thread-safe Router, the thread-safe admission controller, atomics and
// a mutex-guarded upstream map.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/server_callback.h"
#include "router/admission.h"
#include "router/router.h"
#include "services/common/drain.h"
#include "services/router/chat_request.h"
#include "services/router/router_metrics.h"
#include "services/router/stream_pipeline.h"
#include "services/router/tokenize_pool.h"
#include "services/router/upstream.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera::services {

struct InferenceServiceOptions {
  std::string model_name;              // served name; requests may name it or leave it empty
  int context_length = 0;              // reported by ListModels (0 = from workers)
  std::vector<std::string> api_keys;   // empty = no authentication
  router::AdmissionOptions admission;  // in-flight bound and per-priority queues
  absl::Duration max_queue_wait = absl::Seconds(30);  // longest wait for admission
  int max_attempts = 4;       // worker calls per request (retries + migrations)
  int load_interval_ms = 50;  // WatchLoad period asked of workers
  std::shared_ptr<grpc::ChannelCredentials> upstream_credentials;
  // A text prompt longer than this is refused before tokenizing (0 = only
  // the bound the context implies: context x the tokenizer's longest token).
  size_t max_prompt_bytes = 0;
  int tokenize_threads = 2;  // threads of the pool that tokenizes long prompts
};

namespace internal {
class Pipeline;  // stream_pipeline.cc
}  // namespace internal

class InferenceService final
    : public tessera::v1::Inference::WithCallbackMethod_Generate<
          tessera::v1::Inference::WithCallbackMethod_Chat<tessera::v1::Inference::Service>>,
      public UpstreamSink {
 public:
  // `tokenizer` may be null: then only token-id prompts are accepted.
  // `chat` may be null: then Chat is refused (FAILED_PRECONDITION).
  // REQUIRES: router, drain and metrics outlive the service.
  InferenceService(InferenceServiceOptions options, router::Router* router,
                   std::unique_ptr<Tokenizer> tokenizer, DrainState* drain, RouterMetrics* metrics,
                   std::unique_ptr<ChatRenderer> chat = nullptr);
  ~InferenceService() override;

  // Makes the set of workers equal `addresses` (connecting new ones,
  // dropping gone ones).
  void SetWorkers(const std::vector<std::string>& addresses);
  void StopUpstreams();

  // Ends every open Generate stream with a final message (finish reason
  // CANCELLED and the usage so far), cancelling its worker call; for the
  // drain deadline (ServiceHost::SetDrainDeadlineHook). Any thread.
  void CutOpenStreams();

  const router::AdmissionController& admission() const { return admission_; }

  // For the HTTP API: the same checks and state as gRPC.
  // OK when no API keys are configured or `authorization` is "Bearer <a
  // configured key>"; else UNAUTHENTICATED.
  absl::Status CheckApiKey(absl::string_view authorization) const;
  const std::string& model_name() const { return options_.model_name; }
  int context_length() const { return context_length_.load(); }
  int HealthyWorkers() const;
  bool draining() const { return drain_->draining(); }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The pipeline request for a chat (rendered with the chat template); a
  // request that cannot be rendered carries the error (early_error).
  StreamRequest ChatToStream(const tessera::v1::ChatRequest& request) const;
  static StreamRequest GenerateToStream(const tessera::v1::GenerateRequest& request);

  // The reactor deletes itself when the call is done.
  grpc::ServerWriteReactor<tessera::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const tessera::v1::GenerateRequest* request) override;
  grpc::ServerWriteReactor<tessera::v1::GenerateResponse>* Chat(
      grpc::CallbackServerContext* context, const tessera::v1::ChatRequest* request) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const tessera::v1::TokenizeRequest* request,
                        tessera::v1::TokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context,
                          const tessera::v1::ListModelsRequest* request,
                          tessera::v1::ListModelsResponse* response) override;

  // UpstreamSink
  void OnInfo(const std::string& address, const tessera::v1::WorkerInfo& info) override;
  void OnHealth(const std::string& address, bool serving) override;
  void OnLoad(const std::string& address, const tessera::v1::LoadReport& report) override;

 private:
  friend class internal::Pipeline;

  grpc::ServerWriteReactor<tessera::v1::GenerateResponse>* StartGrpcStream(
      grpc::CallbackServerContext* context, StreamRequest request);
  grpc::Status Authenticate(const grpc::ServerContextBase& context) const;
  // OK when `model` is empty or the served name; else NOT_FOUND.
  grpc::Status CheckModel(const std::string& model) const;
  // INVALID_ARGUMENT when a text of `bytes` bytes cannot fit in the context
  // whatever it holds, or exceeds --max_prompt_bytes.
  grpc::Status CheckPromptBytes(size_t bytes) const;
  tessera::v1::Worker::Stub* StubFor(const std::string& address);

  InferenceServiceOptions options_;
  router::Router* router_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatRenderer> chat_;
  DrainState* drain_;
  RouterMetrics* metrics_;
  router::AdmissionController admission_;
  std::atomic<int> context_length_{0};

  absl::Mutex calls_mu_;
  absl::flat_hash_set<StreamPipeline*> calls_ ABSL_GUARDED_BY(calls_mu_);  // open streams

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<WorkerUpstream>> upstreams_ ABSL_GUARDED_BY(mu_);

  // Last, so that it stops (running what is queued) before the rest goes.
  static constexpr int kTokenizeQueue = 64;  // long prompts waiting for the pool
  TokenizePool tokenize_pool_;
};

}  // namespace tessera::services
