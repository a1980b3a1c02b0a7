// A chat cluster for tests of Chat and the HTTP API: a model directory
// written at run time (a byte-level tokenizer whose ids are bytes + 3, the
// ChatML special tokens, a compact Qwen3-style chat template with tools and
// thinking), simulated workers that follow a token script (the simulated
// runner's test-only `script=`), and a router with --http_listen.
//
// The script's replies (see kReply*): no tools in the prompt -> kReplyPlain;
// tools given (the system prompt holds `<tools>`) -> kReplyToolCall; and
// once a tool result (`<tool_response>`) is in the prompt -> kReplyAfterTool.
//
// Plus a blocking HTTP/1.1 client for loopback tests (Connection: close).
//
// Thread-safety: the functions are independent; an HttpStream is used by one
// thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {

inline constexpr char kReplyPlain[] =
    "<think>\nA greeting; answer briefly.\n</think>\n\nHello! Paris is the capital of France. "
    "Ask me anything else.";
inline constexpr char kReplyToolCall[] =
    "<think>\nThe user wants the weather: call the tool.\n</think>\n\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
inline constexpr char kReplyAfterTool[] =
    "<think>\nThe tool answered.\n</think>\n\nIt is sunny in Paris, 21 degrees.";

// Writes the model directory (tokenizer.json, tokenizer_config.json,
// config.json) and, when `with_script`, script.json; returns the
// --simulate spec for its workers (`extra` appended, e.g. decode costs).
std::string WriteChatModel(const std::string& dir, bool with_script,
                           const std::string& extra = "decode_step_us=1000");

struct ChatCluster {
  std::string model_dir;
  Cluster cluster;
  int http_port() const { return cluster.router.http_port; }
};

// `workers` simulated workers on the chat model, a router serving it with
// HTTP; `router_args` are added to the router's flags, `worker_args` to each
// worker's (e.g. --max_num_seqs).
ChatCluster StartChatCluster(int workers = 1, std::vector<std::string> router_args = {},
                             bool with_script = true,
                             const std::string& sim_extra = "decode_step_us=1000",
                             const std::string& api_key = "",
                             std::vector<std::string> worker_args = {});

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
};

// One request on a fresh connection; the whole response.
absl::StatusOr<HttpResponse> HttpCall(int port, const std::string& method, const std::string& path,
                                      const std::string& body,
                                      const std::map<std::string, std::string>& headers = {});

// The `data:` payloads of an SSE body, in order ("[DONE]" included).
std::vector<std::string> SseEvents(const std::string& body);

// A request whose response is read piece by piece (for streams that the
// test abandons midway). The destructor closes the connection.
class HttpStream {
 public:
  ~HttpStream();
  // Sends the request. Errors: cannot connect or write.
  absl::Status Open(int port, const std::string& path, const std::string& body);
  // Reads until `needle` appears in what arrived (true), EOF or `timeout`.
  bool ReadUntil(const std::string& needle, absl::Duration timeout);
  // Reads what arrives next (waiting up to `timeout`); false at EOF,
  // error or timeout.
  bool ReadSome(absl::Duration timeout);
  const std::string& received() const { return received_; }
  void Close();

 private:
  int fd_ = -1;
  std::string received_;
};

}  // namespace tessera::testing
