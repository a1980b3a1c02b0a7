// The OpenAI wire format, converted to and from Tessera's messages:
// request bodies of POST /v1/chat/completions and /v1/completions become
// ChatRequest / GenerateRequest protos (validated field by field, every
// field either mapped, explicitly ignored, or refused naming it), and the
// pipeline's chunks become OpenAI's response and SSE chunk objects. No I/O
// here; openai_handler.h drives it.
//
// Thread-safety: pure functions, and a ResponseWriter per request (not
// thread-safe; one request's owner uses it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grpcpp/support/status.h"
#include "nlohmann/json.hpp"
#include "tessera/v1/inference.pb.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera::services {

// An error answered in OpenAI's shape:
//   {"error": {"message", "type", "param", "code"}}
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};
std::string ErrorJson(const ApiError& error);

// The HTTP status and type for a gRPC status the pipeline ended with.
ApiError ErrorFromStatus(const grpc::Status& status, const std::string& code = "");

struct OpenAiLimits {
  int max_n = 8;  // n (times the prompts of a completion) above it: 400
  int max_stop_strings = 16;
  int max_prompts = 8;  // prompts of one /v1/completions request
};

// One request, ready to run as `choices()` pipelines.
struct ApiRequest {
  bool chat = false;
  std::string model;  // as the client named it (echoed back)
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  // Chat: the request; its sampling holds the shared fields.
  tessera::v1::ChatRequest chat_request;
  // Completions: one request per prompt.
  std::vector<tessera::v1::GenerateRequest> prompts;
  // Logprobs as the client asked: chat (bool + top_logprobs) or
  // completions (an int, the number of alternatives).
  bool logprobs = false;
  int top_logprobs = 0;

  int choices() const { return chat ? n : n * static_cast<int>(prompts.size()); }
};

// Parses and validates a body. `chat` selects the endpoint.
std::optional<ApiError> ParseApiRequest(const std::string& body, bool chat,
                                        const OpenAiLimits& limits, ApiRequest* out);

// Builds the response objects of one request (ids, timestamps, logprob
// token texts) from the pipeline's messages.
class ResponseWriter {
 public:
  // `tokenizer` (may be null) gives the text of logprob tokens.
  ResponseWriter(const ApiRequest& request, std::string id, const Tokenizer* tokenizer);

  // Streaming: the SSE event (`data: {...}\n\n`) for a chunk of choice
  // `index`, or "" when it carries nothing to send.
  std::string ChunkEvent(int index, const tessera::v1::Chunk& chunk);
  // Streaming: the event that ends choice `index` (finish_reason).
  std::string FinishEvent(int index, const tessera::v1::Complete& complete);
  // Streaming: the usage chunk (choices: []) when include_usage, then
  // `data: [DONE]`.
  std::string EndEvents();
  // Streaming: an error after the stream started, then `data: [DONE]`.
  static std::string ErrorEvent(const ApiError& error);

  // Non-streaming: accumulates, then the whole response body.
  void Accumulate(int index, const tessera::v1::Chunk& chunk);
  void AccumulateFinish(int index, const tessera::v1::Complete& complete);
  std::string ResponseBody() const;

 private:
  struct Choice {
    std::string content;
    std::string reasoning;
    nlohmann::json tool_calls = nlohmann::json::array();
    nlohmann::json logprobs;  // chat: content[]; completions: the four lists
    int text_offset = 0;
    std::string finish_reason;
    bool role_sent = false;
    bool saw_tool_call = false;
  };
  nlohmann::json Envelope() const;
  nlohmann::json LogprobsFor(Choice& choice, const tessera::v1::Chunk& chunk);
  std::string FinishReason(const Choice& choice, const tessera::v1::Complete& complete) const;
  void AddUsage(const tessera::v1::Complete& complete, int index);
  nlohmann::json UsageJson() const;

  const ApiRequest& request_;
  const std::string id_;
  const int64_t created_;
  const Tokenizer* tokenizer_;
  std::vector<Choice> choices_;
  std::vector<int> prompt_tokens_;  // per prompt
  int completion_tokens_ = 0;
  int cached_tokens_ = 0;
};

// The bytes of SSE event `data: <json>\n\n`.
std::string SseData(const std::string& json);

}  // namespace tessera::services
