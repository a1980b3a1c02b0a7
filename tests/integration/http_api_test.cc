// The router's OpenAI-compatible HTTP API and the Chat RPC, against a real
// router and simulated workers that follow a token script
// (chat_fixture.h): chat with reasoning and tool calls (HTTP and gRPC),
// streaming with usage, completions with token prompts, bad input answered
// in OpenAI's error shape with the right status, 401 / 429 / 503, and a
// mid-stream disconnect that frees the worker's KV blocks.
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/chat_fixture.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kChat[] = "/v1/chat/completions";

json Hello() { return json::array({{{"role", "user"}, {"content", "Hello?"}}}); }

json WeatherTool() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "Weather of a city"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}}}}},
                           {"required", {"city"}}}}}}}});
}

HttpResponse Post(int port, const std::string& path, const json& body,
                  const std::map<std::string, std::string>& headers = {}) {
  auto r = HttpCall(port, "POST", path, body.dump(), headers);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

// The error object of an OpenAI error response, checked for its shape.
json ErrorOf(const HttpResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  if (j.is_discarded() || !j.contains("error")) {
    ADD_FAILURE() << "not an OpenAI error: " << r.body;
    return json::object();
  }
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  return e;
}

TEST(HttpApiTest, ChatSeparatesReasoningAndParsesToolCallsRoundTrip) {
  ChatCluster c = StartChatCluster();
  // Without tools: reasoning apart from content.
  HttpResponse r = Post(c.http_port(), kChat, {{"model", "default"}, {"messages", Hello()}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  const json& msg = j["choices"][0]["message"];
  // The reasoning parser keeps what follows </think> as the model wrote it.
  EXPECT_EQ(msg["content"], "\n\nHello! Paris is the capital of France. Ask me anything else.");
  EXPECT_EQ(msg["reasoning_content"], "\nA greeting; answer briefly.\n");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);

  // With a tool: a structured call, finish_reason tool_calls.
  json messages = Hello();
  r = Post(c.http_port(), kChat, {{"messages", messages}, {"tools", WeatherTool()}});
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  const json& call_msg = j["choices"][0]["message"];
  ASSERT_EQ(call_msg["tool_calls"].size(), 1u) << r.body;
  const json& call = call_msg["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(call_msg["content"].is_null()) << r.body;

  // The tool's result goes back; the model answers with content.
  messages.push_back({{"role", "assistant"}, {"content", nullptr},
                      {"tool_calls", call_msg["tool_calls"]}});
  messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "sunny, 21C"}});
  r = Post(c.http_port(), kChat, {{"messages", messages}, {"tools", WeatherTool()}});
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "\n\nIt is sunny in Paris, 21 degrees.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST(HttpApiTest, StreamingChatSendsDeltasUsageAndDone) {
  ChatCluster c = StartChatCluster();
  HttpResponse r = Post(c.http_port(), kChat,
                        {{"messages", Hello()},
                         {"tools", WeatherTool()},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers["content-type"], HasSubstr("text/event-stream"));
  std::vector<std::string> events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string reasoning, content;
  int calls = 0;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e.contains("usage")) {
      usage = e["usage"];
      EXPECT_TRUE(e["choices"].empty());
      continue;
    }
    const json& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      calls += static_cast<int>(d["tool_calls"].size());
      EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "get_weather");
    }
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "\nThe user wants the weather: call the tool.\n");
  EXPECT_EQ(content, "");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_TRUE(usage.is_object()) << r.body;
  EXPECT_GT(usage["completion_tokens"].get<int>(), 10);
  EXPECT_EQ(usage["total_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
}

TEST(HttpApiTest, ChatRpcStreamsReasoningAndToolCallDeltas) {
  ChatCluster c = StartChatCluster();
  tessera::v1::ChatRequest req;
  auto* m = req.add_messages();
  m->set_role("user");
  m->set_content("Weather?");
  auto* tool = req.add_tools();
  tool->set_name("get_weather");
  tool->set_parameters_json(R"({"type":"object","properties":{"city":{"type":"string"}}})");
  grpc::ClientContext ctx;
  auto reader = c.cluster.stub->Chat(&ctx, req);
  tessera::v1::GenerateResponse resp;
  std::string reasoning, text;
  std::vector<tessera::v1::ToolCallDelta> calls;
  bool complete = false;
  while (reader->Read(&resp)) {
    reasoning += resp.chunk().reasoning();
    text += resp.chunk().text();
    for (const auto& t : resp.chunk().tool_calls()) calls.push_back(t);
    complete |= resp.has_complete();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(complete);
  EXPECT_EQ(reasoning, "\nThe user wants the weather: call the tool.\n");
  EXPECT_EQ(text, "");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name(), "get_weather");
  EXPECT_EQ(json::parse(calls[0].arguments()), json({{"city", "Paris"}}));
  EXPECT_FALSE(calls[0].id().empty());

  // An empty chat is INVALID_ARGUMENT.
  grpc::ClientContext ctx2;
  tessera::v1::ChatRequest empty;
  auto r2 = c.cluster.stub->Chat(&ctx2, empty);
  while (r2->Read(&resp)) {
  }
  EXPECT_EQ(r2->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(HttpApiTest, CompletionsTakeTokenPromptsStopStringsAndLogprobs) {
  ChatCluster c = StartChatCluster();
  // The plain reply, stopped at a stop string.
  HttpResponse r = Post(c.http_port(), "/v1/completions",
                        {{"prompt", "Say hello"}, {"max_tokens", 200}, {"stop", "capital"},
                         {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text, "<think>\nA greeting; answer briefly.\n</think>\n\nHello! Paris is the ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.body;
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  EXPECT_GE(lp["tokens"].size(), 10u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  // Token ids as the prompt, n = 2.
  r = Post(c.http_port(), "/v1/completions", {{"prompt", {60, 61, 62}}, {"max_tokens", 4}, {"n", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
}

TEST(HttpApiTest, BadInputIsAnsweredInOpenAiShapeNeverACrash) {
  ChatCluster c = StartChatCluster(1, {"--http_max_body_bytes=65536", "--max_n=4"});
  const int port = c.http_port();
  struct Case {
    std::string body;
    int status;
    std::string param;
    std::string code;
  };
  const std::string big_prompt(5000, 'x');
  std::vector<Case> cases = {
      {"{not json", 400, "", ""},
      {"[1,2]", 400, "", ""},
      {std::string(200, '[') + std::string(200, ']'), 400, "", ""},
      {json({{"messages", "hi"}}).dump(), 400, "messages", ""},
      {json({{"messages", json::array()}}).dump(), 400, "messages", ""},
      {json({{"messages", Hello()}, {"max_tokens", "ten"}}).dump(), 400, "max_tokens", ""},
      {json({{"messages", Hello()}, {"temperature", 7}}).dump(), 400, "temperature", ""},
      {json({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}).dump(), 400,
       "messages[0].role", ""},
      {json({{"messages", Hello()}, {"n", 5}}).dump(), 400, "n", ""},
      {json({{"messages", Hello()}, {"response_format", {{"type", "json_schema"}}}}).dump(), 400,
       "response_format", ""},
      {json({{"messages", Hello()}, {"tool_choice", "required"}, {"tools", WeatherTool()}}).dump(),
       400, "tool_choice", ""},
      {json({{"messages", Hello()}, {"frobnicate", 1}}).dump(), 400, "frobnicate", ""},
      {json({{"messages", Hello()}, {"model", "gpt-17"}}).dump(), 404, "model", "model_not_found"},
      {json({{"messages", {{{"role", "user"}, {"content", big_prompt}}}}}).dump(), 400, "",
       "context_length_exceeded"},
      {json({{"messages", Hello()}, {"max_tokens", 100000}}).dump(), 400, "",
       "context_length_exceeded"},
      {json({{"messages", Hello()}, {"pad", std::string(70000, 'p')}}).dump(), 413, "",
       "request_too_large"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.body.substr(0, 120));
    auto r = HttpCall(port, "POST", kChat, k.body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, k.status) << r->body;
    json e = ErrorOf(*r);
    if (!k.param.empty()) EXPECT_EQ(e["param"], k.param) << r->body;
    if (!k.code.empty()) EXPECT_EQ(e["code"], k.code) << r->body;
  }
  // Unknown path and method.
  auto r = HttpCall(port, "GET", "/v1/nothing", "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  ErrorOf(*r);
  r = HttpCall(port, "GET", kChat, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  // A garbled request line.
  r = HttpCall(port, "BR OKEN", "/", "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  // Still serving.
  r = HttpCall(port, "GET", "/health", "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200) << r->body;
  r = HttpCall(port, "GET", "/v1/models", "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "default");
}

TEST(HttpApiTest, ApiKeysAreCheckedOnHttp) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/keys") << "sekrit\n";
  ChatCluster c = StartChatCluster(1, {"--api_keys_file=" + dir + "/keys"}, true,
                                   "decode_step_us=1000", "sekrit");
  HttpResponse r = Post(c.http_port(), kChat, {{"messages", Hello()}});
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(ErrorOf(r)["type"], "authentication_error");
  r = Post(c.http_port(), kChat, {{"messages", Hello()}}, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r.status, 401);
  r = Post(c.http_port(), kChat, {{"messages", Hello()}}, {{"Authorization", "Bearer sekrit"}});
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(HttpApiTest, AdmissionRefusalIs429WithRetryAfterAndNoWorkerIs503) {
  // One slot, no queue: a second request while one streams is refused.
  ChatCluster c = StartChatCluster(1, {"--max_in_flight=1", "--max_queue_per_priority=0"}, false,
                                   "decode_step_us=20000");
  HttpStream open;
  ASSERT_TRUE(open.Open(c.http_port(), kChat,
                        json({{"messages", Hello()}, {"max_tokens", 2000}, {"stream", true}})
                            .dump())
                  .ok());
  ASSERT_TRUE(open.ReadUntil("data:", absl::Seconds(20))) << open.received();
  HttpResponse r = Post(c.http_port(), kChat, {{"messages", Hello()}, {"max_tokens", 2}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_FALSE(r.headers["retry-after"].empty());
  EXPECT_EQ(ErrorOf(r)["code"], "rate_limit_exceeded");
  open.Close();

  // A router whose only worker does not exist.
  const std::string dir = MakeTempDir();
  WriteChatModel(dir, false);
  Service router = StartService("services/router/tessera-router",
                                {"--workers=127.0.0.1:1", "--tokenizer=" + dir,
                                 "--http_listen=127.0.0.1:0"});
  ASSERT_GT(router.http_port, 0);
  r = Post(router.http_port, kChat, {{"messages", Hello()}});
  EXPECT_EQ(r.status, 503) << r.body;
  ErrorOf(r);
  auto health = HttpCall(router.http_port, "GET", "/health", "");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 503);
}

TEST(HttpApiTest, DisconnectMidStreamFreesTheWorkersKvBlocks) {
  ChatCluster c = StartChatCluster(1, {}, false, "decode_step_us=20000");
  const int metrics = c.cluster.workers[0].metrics_port;
  const std::string kv = "tessera_worker_kv_cache_usage_ratio";
  ASSERT_EQ(MetricValue(metrics, kv), 0);
  {
    HttpStream s;
    json messages = {{{"role", "user"}, {"content", std::string(600, 'q')}}};
    ASSERT_TRUE(s.Open(c.http_port(), kChat,
                       json({{"messages", messages}, {"max_tokens", 3000}, {"stream", true}})
                           .dump())
                    .ok());
    ASSERT_TRUE(s.ReadUntil("data:", absl::Seconds(20))) << s.received();
    absl::Time until = absl::Now() + absl::Seconds(10);
    while (MetricValue(metrics, kv) <= 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_GT(MetricValue(metrics, kv), 0) << "the stream's blocks are in use";
  }  // the client disconnects
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (MetricValue(metrics, kv) != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(MetricValue(metrics, kv), 0) << "the worker still holds the abandoned stream's blocks";
  EXPECT_EQ(MetricValue(c.cluster.router.metrics_port,
                        "tessera_router_requests_total{outcome=\"cancelled\"}"),
            1);
}

}  // namespace
}  // namespace tessera::testing
