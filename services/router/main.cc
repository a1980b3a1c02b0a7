// tessera-router: the public tessera.v1.Inference service of a cluster.
//
// Workers come from --workers (a static list), --workers_file (one
// address per line, '#' comments; re-read when it changes) and/or
// --workers_dns (every address of a name, looked up again every
// --workers_dns_interval: a Kubernetes headless Service; router/worker_dns.h).
// The router uses the union of the three.
//
// --http_listen adds the OpenAI-compatible HTTP API (openai_handler.h) on a
// port of its own; its bound port goes to the port file as http_port.
#include <sys/resource.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "router/router.h"
#include "router/worker_dns.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/router/chat_request.h"
#include "services/router/http_server.h"
#include "services/router/inference_service.h"
#include "services/router/openai_handler.h"
#include "services/router/router_metrics.h"
#include "services/router/upstream.h"

ABSL_FLAG(std::vector<std::string>, workers, {}, "Worker addresses host:port, comma-separated");
ABSL_FLAG(std::string, workers_file, "", "File listing worker addresses, re-read on change");
ABSL_FLAG(std::string, workers_dns, "",
          "host:port whose DNS addresses are the workers (a headless Service), looked up again "
          "every --workers_dns_interval");
ABSL_FLAG(absl::Duration, workers_dns_interval, absl::Seconds(5),
          "Period of --workers_dns lookups");
ABSL_FLAG(std::string, tokenizer, "", "Tokenizer directory (tokenizer.json); empty = ids only");
ABSL_FLAG(std::string, served_model_name, "default", "Model name clients may ask for");
ABSL_FLAG(std::string, policy, "cost", "Routing policy: cost, round_robin or least_loaded");
ABSL_FLAG(std::string, api_keys_file, "", "File of accepted API keys, one per line");
ABSL_FLAG(int, max_in_flight, 1024,
          "Requests worked on at once; more wait in their priority's queue");
ABSL_FLAG(
    int, max_queue_per_priority, 256,
    "Requests that may wait per priority class; beyond it RESOURCE_EXHAUSTED with a retry hint");
ABSL_FLAG(absl::Duration, max_queue_wait, absl::Seconds(30), "Longest wait for admission");
ABSL_FLAG(int, max_attempts, 4, "Worker calls per request (retries and migrations)");
ABSL_FLAG(int, load_interval_ms, 50, "Load report period asked of workers");
ABSL_FLAG(absl::Duration, load_staleness, absl::Seconds(2),
          "A worker not heard from for this long gets no new requests");
ABSL_FLAG(int64_t, max_prompt_bytes, 0,
          "Text prompts longer than this are refused before tokenizing (0 = only the bound "
          "the context implies: context tokens x the tokenizer's longest token)");
ABSL_FLAG(int, tokenize_threads, 2,
          "Threads that tokenize long text prompts (off the threads serving requests)");
ABSL_FLAG(std::string, http_listen, "",
          "host:port of the OpenAI-compatible HTTP API (port 0 picks one); empty = no HTTP");
// 4, not 2: on a saturated host the kernel shares the cores per runnable
// thread, and with 2 a burst of requests waited longer on the HTTP loop than
// on gRPC's (more) server threads (tests/bench/results/http_chat_bench*.json).
ABSL_FLAG(int, http_threads, 4, "Threads running the HTTP server's event loop");
ABSL_FLAG(int64_t, http_max_body_bytes, 8 << 20, "Largest HTTP request body (larger: 413)");
ABSL_FLAG(int, http_max_connections, 16384, "Open HTTP connections at most");
ABSL_FLAG(int, max_n, 8, "Largest n (choices per request) of the HTTP API");
ABSL_FLAG(std::string, chat_template_dir, "",
          "Model directory whose chat template (tokenizer_config.json or chat_template.jinja) "
          "and config.json serve Chat; default: --tokenizer");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "Tool-call format of the model's output: auto (from the template), none, qwen3, "
          "llama3_json or deepseek_v3");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "Separate <think> reasoning from content: on, off, or auto (on when the chat "
          "template mentions <think>)");
ABSL_FLAG(std::string, upstream_tls_ca, "", "PEM CA for TLS to workers; empty = plaintext");
ABSL_FLAG(std::string, upstream_tls_cert, "", "PEM client certificate for mTLS to workers");
ABSL_FLAG(std::string, upstream_tls_key, "", "PEM key of --upstream_tls_cert");
ABSL_FLAG(std::string, upstream_tls_target_name, "",
          "Name the workers' certificates must carry; default: the host of each worker address "
          "(set it for workers found by IP through --workers_dns)");

namespace ts = tessera::services;

namespace {

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& flag,
                                                   const std::string& path) {
  auto text = ts::ReadFileForFlag(flag, path);
  if (!text.ok()) return text.status();
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (!line.empty()) out.emplace_back(line);
  }
  return out;
}

std::vector<std::string> Merge(const std::vector<std::string>& a,
                               const std::vector<std::string>& b) {
  std::set<std::string> s(a.begin(), a.end());
  s.insert(b.begin(), b.end());
  return {s.begin(), s.end()};
}

}  // namespace

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv,
                        "tessera-router: routes requests to workers (tessera.v1.Inference)");
  tessera::SetLogService("router");

  tessera::router::RouterOptions ro;
  auto policy = tessera::router::ParsePolicyKind(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) return ts::StartupError(policy.status());
  ro.policy.kind = *policy;
  ro.registry.load_staleness = absl::GetFlag(FLAGS_load_staleness);

  ts::InferenceServiceOptions so;
  so.model_name = absl::GetFlag(FLAGS_served_model_name);
  so.admission.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  so.admission.max_queued_per_priority = absl::GetFlag(FLAGS_max_queue_per_priority);
  so.max_queue_wait = absl::GetFlag(FLAGS_max_queue_wait);
  so.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  so.load_interval_ms = absl::GetFlag(FLAGS_load_interval_ms);
  so.tokenize_threads = absl::GetFlag(FLAGS_tokenize_threads);
  if (so.admission.max_in_flight < 1 || so.admission.max_queued_per_priority < 0 ||
      so.max_attempts < 1 || so.load_interval_ms < 10 || so.tokenize_threads < 1 ||
      absl::GetFlag(FLAGS_max_prompt_bytes) < 0) {
    return ts::StartupError(absl::InvalidArgumentError(
        "--max_in_flight, --max_attempts and --tokenize_threads must be >= 1, "
        "--max_queue_per_priority and --max_prompt_bytes >= 0, --load_interval_ms >= 10"));
  }
  so.max_prompt_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_prompt_bytes));
  if (!absl::GetFlag(FLAGS_api_keys_file).empty()) {
    auto keys = ReadLines("api_keys_file", absl::GetFlag(FLAGS_api_keys_file));
    if (!keys.ok()) return ts::StartupError(keys.status());
    if (keys->empty()) {
      return ts::StartupError(absl::InvalidArgumentError("--api_keys_file lists no key"));
    }
    so.api_keys = *keys;
  }
  auto creds = ts::MakeChannelCredentials({absl::GetFlag(FLAGS_upstream_tls_ca),
                                           absl::GetFlag(FLAGS_upstream_tls_cert),
                                           absl::GetFlag(FLAGS_upstream_tls_key)});
  if (!creds.ok()) return ts::StartupError(creds.status());
  const std::string target_name = absl::GetFlag(FLAGS_upstream_tls_target_name);
  if (!target_name.empty() && absl::GetFlag(FLAGS_upstream_tls_ca).empty()) {
    return ts::StartupError(
        absl::InvalidArgumentError("--upstream_tls_target_name needs TLS (--upstream_tls_ca)"));
  }
  so.upstream_credentials = ts::WithTargetNameOverride(*creds, target_name);

  // Thousands of HTTP streams need as many descriptors: raise the soft
  // limit to the hard one.
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  std::unique_ptr<tessera::Tokenizer> tokenizer;
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    auto t = tessera::Tokenizer::FromDirectory(absl::GetFlag(FLAGS_tokenizer));
    if (!t.ok()) return ts::StartupError(t.status());
    tokenizer = std::move(*t);
  }
  // The chat template, from the tokenizer's directory unless told.
  std::unique_ptr<ts::ChatRenderer> chat;
  {
    ts::ChatOptions co;
    co.tool_call_parser = absl::GetFlag(FLAGS_tool_call_parser);
    const std::string rp = absl::GetFlag(FLAGS_reasoning_parser);
    if (rp == "on") {
      co.reasoning = ts::ReasoningMode::kOn;
    } else if (rp == "off") {
      co.reasoning = ts::ReasoningMode::kOff;
    } else if (rp != "auto") {
      return ts::StartupError(absl::InvalidArgumentError(
          absl::StrCat("--reasoning_parser=", rp, ": expected on, off or auto")));
    }
    std::string dir = absl::GetFlag(FLAGS_chat_template_dir);
    const bool explicit_dir = !dir.empty();
    if (dir.empty()) dir = absl::GetFlag(FLAGS_tokenizer);
    if (!dir.empty()) {
      auto c = ts::ChatRenderer::Load(dir, co);
      if (c.ok()) {
        chat = std::move(*c);
        tessera::LogInfo("chat template loaded", {{"dir", dir},
                                                  {"tool_call_parser", chat->tool_format()},
                                                  {"reasoning", chat->reasoning() ? "on" : "off"}});
      } else if (explicit_dir || c.status().code() != absl::StatusCode::kNotFound) {
        // A template that is there but cannot be served is a startup error,
        // never a chat rendered wrong later.
        return ts::StartupError(c.status());
      } else {
        tessera::LogInfo("no chat template: Chat and /v1/chat/completions are refused",
                         {{"dir", dir}});
      }
    }
  }
  const std::vector<std::string> static_workers = absl::GetFlag(FLAGS_workers);
  const std::string workers_file = absl::GetFlag(FLAGS_workers_file);
  std::vector<std::string> file_workers;
  if (!workers_file.empty()) {
    auto w = ReadLines("workers_file", workers_file);
    if (!w.ok()) return ts::StartupError(w.status());
    file_workers = *w;
  }
  std::optional<tessera::router::WorkerDnsOptions> dns;
  if (!absl::GetFlag(FLAGS_workers_dns).empty()) {
    auto target = tessera::router::ParseDnsTarget(absl::GetFlag(FLAGS_workers_dns));
    if (!target.ok()) return ts::StartupError(target.status());
    dns = tessera::router::WorkerDnsOptions{*target, absl::GetFlag(FLAGS_workers_dns_interval)};
    if (dns->interval < absl::Milliseconds(100)) {
      return ts::StartupError(
          absl::InvalidArgumentError("--workers_dns_interval must be >= 100ms"));
    }
  }
  if (static_workers.empty() && workers_file.empty() && !dns) {
    return ts::StartupError(absl::InvalidArgumentError(
        "give the workers with --workers, --workers_file and/or --workers_dns"));
  }

  ts::ServiceHost host(ts::ServerOptionsFromFlags("router"));
  ts::RouterMetrics metrics(host.metrics().registry());
  tessera::router::Router router(ro);
  ts::InferenceService service(so, &router, std::move(tokenizer), &host.drain(), &metrics,
                               std::move(chat));
  auto state = std::make_shared<ts::RouterStateCollector>(&router, &service.admission());
  host.metrics().AddCollectable(state);
  host.AddService(&service, "tessera.v1.Inference");
  host.SetDrainDeadlineHook([&service] { service.CutOpenStreams(); });
  // The HTTP API: the same service (keys, admission, routing, drain,
  // metrics) behind a second listener.
  ts::OpenAiLimits limits;
  limits.max_n = absl::GetFlag(FLAGS_max_n);
  ts::OpenAiHandler openai(&service, limits);
  std::unique_ptr<ts::HttpServer> http;
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    ts::HttpServerOptions ho;
    ho.listen = absl::GetFlag(FLAGS_http_listen);
    ho.threads = absl::GetFlag(FLAGS_http_threads);
    ho.max_connections = absl::GetFlag(FLAGS_http_max_connections);
    if (ho.threads < 1 || limits.max_n < 1 || absl::GetFlag(FLAGS_http_max_body_bytes) < 1024 ||
        ho.max_connections < 1) {
      return ts::StartupError(absl::InvalidArgumentError(
          "--http_threads, --max_n and --http_max_connections must be >= 1, "
          "--http_max_body_bytes >= 1024"));
    }
    ho.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes));
    ho.error_body = [](int status, const std::string& message) {
      ts::ApiError e;
      e.http_status = status;
      e.message = message;
      if (status == 413) e.code = "request_too_large";
      return ts::ErrorJson(e);
    };
    auto server = ts::HttpServer::Start(
        std::move(ho), [&openai](ts::HttpRequest req, std::shared_ptr<ts::HttpExchange> ex) {
          openai.Handle(std::move(req), std::move(ex));
        });
    if (!server.ok()) return ts::StartupError(server.status());
    http = std::move(*server);
    host.AddPortFileEntry("http_port", http->port());
  }
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);
  // The union of the three sources; each update under one lock.
  absl::Mutex workers_mu;
  std::vector<std::string> dns_workers;
  auto set_workers = [&](const std::vector<std::string>* file, const std::vector<std::string>* d) {
    absl::MutexLock lock(&workers_mu);
    if (file != nullptr) file_workers = *file;
    if (d != nullptr) dns_workers = *d;
    service.SetWorkers(Merge(Merge(static_workers, file_workers), dns_workers));
  };
  set_workers(nullptr, nullptr);
  std::unique_ptr<tessera::router::WorkerDnsWatcher> dns_watcher;
  if (dns) {
    dns_watcher = std::make_unique<tessera::router::WorkerDnsWatcher>(
        *dns, tessera::router::SystemDnsLookup, [&](const std::vector<std::string>& w) {
          tessera::LogInfo("workers from DNS", {{"target", absl::GetFlag(FLAGS_workers_dns)},
                                                {"workers", absl::StrJoin(w, ",")}});
          set_workers(nullptr, &w);
        });
    if (auto s = dns_watcher->Start(); !s.ok()) {
      tessera::LogWarning("worker DNS lookup failed; retrying",
                          {{"error", std::string(s.message())}});
    }
  }

  // Re-read the workers file when it changes.
  std::thread watcher;
  if (!workers_file.empty()) {
    watcher = std::thread([&] {
      struct timespec last {};
      while (!host.drain().WaitDrainingFor(absl::Seconds(1))) {
        struct stat st;
        if (stat(workers_file.c_str(), &st) != 0) continue;
        if (st.st_mtim.tv_sec == last.tv_sec && st.st_mtim.tv_nsec == last.tv_nsec) continue;
        last = st.st_mtim;
        auto w = ReadLines("workers_file", workers_file);
        if (!w.ok()) {
          tessera::LogWarning("workers file unreadable",
                              {{"error", std::string(w.status().message())}});
          continue;
        }
        set_workers(&*w, nullptr);
      }
    });
  }
  host.SetReady(true);
  int code = host.RunUntilShutdown();
  if (watcher.joinable()) watcher.join();
  if (dns_watcher) dns_watcher->Stop();
  http.reset();  // the drain is over: no stream is open
  service.StopUpstreams();
  return code;
}
