// OpenAiHandler: the OpenAI-compatible HTTP API over the router's
// InferenceService — the same API keys, admission, routing, workers, drain
// and metrics as gRPC, because each choice of a request is a StreamPipeline
// (stream_pipeline.h) whose sink writes to the HTTP exchange.
//
//   POST /v1/chat/completions   chat (messages, tools), SSE when "stream"
//   POST /v1/completions        a prompt (text or token ids), SSE when "stream"
//   GET  /v1/models             the served model
//   GET  /health                200 when a worker is healthy and not draining
//
// A request with n choices runs n pipelines (seed + i for choice i when a
// seed is given). Streams send their SSE headers with the first chunk, so a
// request refused before any output (400, 401, 404, 429 with Retry-After,
// 503) gets a real HTTP status and OpenAI's error object. A client that
// disconnects cancels every pipeline of its request, and so its worker
// calls (whose KV blocks the workers then free).
//
// Thread-safety: Handle runs on the HTTP server's threads; the per-request
// state is guarded by its own mutex.
#pragma once

#include <memory>

#include "services/router/http_server.h"
#include "services/router/inference_service.h"
#include "services/router/openai_api.h"

namespace tessera::services {

class OpenAiHandler {
 public:
  // REQUIRES: `service` outlives the handler and every request it started.
  OpenAiHandler(InferenceService* service, OpenAiLimits limits)
      : service_(service), limits_(limits) {}

  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange);

 private:
  void ListModels(const HttpRequest& request, HttpExchange& exchange);
  void Health(HttpExchange& exchange);
  void Complete(HttpRequest request, std::shared_ptr<HttpExchange> exchange, bool chat);

  InferenceService* const service_;
  const OpenAiLimits limits_;
};

}  // namespace tessera::services
