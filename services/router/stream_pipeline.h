// StreamPipeline: one generation request through the router, whatever
// transport it came by (gRPC Generate or Chat, the HTTP API):
//
//   tokenize (text prompts) → admit (bounded in-flight, a retry hint when
//   refused) → route → stream from the chosen worker, retrying before the
//   first token and migrating after it → detokenize incrementally → stop
//   strings (a match cancels the worker's stream) → output parsing (chat:
//   reasoning and tool calls) → complete with usage.
//
// The transport is a StreamSink: the pipeline hands it messages one at a
// time (the next only after the transport reported the previous one written
// with OnWriteDone), then ends it with one final message or an error. The
// transport reports the client's cancellation (OnCancel) and, after the
// end, that it is done with the sink (OnDone); the pipeline then deletes
// itself and the sink.
//
// Threading: every reaction (the transport's, the worker call's, the
// admission queue's) becomes an event; events run one at a time, in order,
// on the thread that posted the first of a burst (an actor), with no lock
// held while they run. No thread is held while a stream waits for
// admission, for a worker's token or for the client.
//
// Thread-safety: Start, OnWriteDone, OnCancel, OnDone and Cut may be called
// from any thread. The sink's methods are called from the pipeline's events,
// one at a time, and must not block.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "tessera/v1/inference.pb.h"
#include "text/parsers/output_parser.h"

namespace tessera::services {

class InferenceService;

// What to generate. Built by the transport adapters.
struct StreamRequest {
  std::string request_id;
  std::string model;  // checked against the served name
  // The prompt: text (tokenized by the router) or token ids.
  bool has_text = false;
  std::string text;
  std::vector<int32_t> token_ids;
  bool add_special_tokens = true;  // BOS etc. when tokenizing `text`
  bool keep_special_tokens = false;
  tessera::v1::SamplingParams sampling;
  tessera::v1::Priority priority = tessera::v1::PRIORITY_UNSPECIFIED;
  std::string routing_key;
  absl::Time deadline = absl::InfiniteFuture();
  // Chat: the output is split into content, reasoning and tool calls.
  std::optional<text::OutputParserOptions> output_parser;
  // When not OK, the request fails at once with it (e.g. a chat that could
  // not be rendered); `early_outcome` labels it in the metrics.
  absl::Status early_error;
  std::string early_outcome = "invalid";
};

// Why a request ended without a final message.
struct StreamError {
  grpc::Status status;
  std::optional<absl::Duration> retry_after;  // admission refused: try again then
  // A machine-readable reason where one applies: "context_length_exceeded".
  std::string code;
};

class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Sends `message` (valid until OnWriteDone); the transport then calls
  // StreamPipeline::OnWriteDone.
  virtual void Write(const tessera::v1::GenerateResponse& message) = 0;
  // Sends the final message (a `complete`) and ends the stream; the
  // transport then calls OnDone.
  virtual void WriteLastAndFinish(const tessera::v1::GenerateResponse& message) = 0;
  // Ends the stream with an error; the transport then calls OnDone.
  virtual void Fail(const StreamError& error) = 0;
};

class StreamPipeline {
 public:
  // A pipeline that owns `sink`; nothing runs before Start. The pipeline
  // deletes itself after OnDone. REQUIRES: `service` outlives it.
  static StreamPipeline* Create(InferenceService* service, StreamRequest request,
                                std::unique_ptr<StreamSink> sink);
  virtual ~StreamPipeline() = default;

  virtual void Start() = 0;
  virtual void OnWriteDone(bool ok) = 0;
  // The client cancelled or went away: the worker call is cancelled.
  virtual void OnCancel() = 0;
  // The transport is done with the sink: the last event.
  virtual void OnDone() = 0;

  // The router's drain deadline passed: end the stream with a final
  // message. Returns true when the caller must RunQueue() (outside locks).
  virtual bool EnqueueCut() = 0;
  virtual void RunQueue() = 0;
};

}  // namespace tessera::services
