// tessera-router: the public tessera.v1.Inference service of a cluster.
//
// Workers come from --workers (a static list), --workers_file (one
// address per line, '#' comments; re-read when it changes) and/or
// --workers_dns (every address of a name, looked up again every
// --workers_dns_interval: a Kubernetes headless Service; router/worker_dns.h).
// The router uses the union of the three.
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
#include "services/router/inference_service.h"
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

  std::unique_ptr<tessera::Tokenizer> tokenizer;
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    auto t = tessera::Tokenizer::FromDirectory(absl::GetFlag(FLAGS_tokenizer));
    if (!t.ok()) return ts::StartupError(t.status());
    tokenizer = std::move(*t);
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
  ts::InferenceService service(so, &router, std::move(tokenizer), &host.drain(), &metrics);
  auto state = std::make_shared<ts::RouterStateCollector>(&router, &service.admission());
  host.metrics().AddCollectable(state);
  host.AddService(&service, "tessera.v1.Inference");
  host.SetDrainDeadlineHook([&service] { service.CutOpenStreams(); });
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
  service.StopUpstreams();
  return code;
}
