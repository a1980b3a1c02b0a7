// http_chat_bench: many concurrent streaming chat requests through a real
// tessera-router and simulated workers, over the gRPC Chat RPC and over the
// HTTP API (/v1/chat/completions, SSE), in one run, one path after the
// other with the same load. Reports, per path: errors, time to first token
// and per-token latency (p50/p99), and the router's peak threads and
// resident memory; and the HTTP path's p99 over the gRPC path's.
//
//   http_chat_bench --streams=1000 --workers=4 --max_tokens=64 --out=result.json
//
// Each client stream runs on a thread of this program (blocking socket or
// blocking gRPC reader); the router serves them all event-driven.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "tests/integration/chat_fixture.h"

ABSL_FLAG(int, streams, 1000, "Concurrent streams per path");
ABSL_FLAG(int, workers, 4, "Simulated workers");
ABSL_FLAG(int, max_tokens, 64, "Tokens per stream");
ABSL_FLAG(int, decode_step_us, 20000, "Simulated decode step (per batch)");
ABSL_FLAG(std::string, out, "", "Write the JSON result here (and print it)");

namespace tt = tessera::testing;
using nlohmann::json;

namespace {

struct StreamStats {
  bool ok = false;
  double ttft_ms = 0;
  double per_token_ms = 0;
  int chunks = 0;
};

json Percentiles(std::vector<double> v) {
  if (v.empty()) return json::object();
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {{"p50", at(0.50)}, {"p90", at(0.90)}, {"p99", at(0.99)}, {"max", v.back()}};
}

StreamStats HttpOne(int port, const std::string& body) {
  StreamStats s;
  tt::HttpStream h;
  const absl::Time start = absl::Now();
  if (!h.Open(port, "/v1/chat/completions", body).ok()) return s;
  absl::Time first, last;
  size_t seen = 0;
  // Each content event is one token at this rate (one token per chunk).
  while (h.ReadSome(absl::Seconds(120))) {
    const std::string& got = h.received();
    size_t pos;
    while ((pos = got.find("data: ", seen)) != std::string::npos) {
      const size_t end = got.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string ev = got.substr(pos + 6, end - pos - 6);
      seen = end + 2;
      if (ev == "[DONE]") {
        s.ok = s.chunks > 0;
        s.ttft_ms = absl::ToDoubleMilliseconds(first - start);
        if (s.chunks > 1)
          s.per_token_ms = absl::ToDoubleMilliseconds(last - first) / (s.chunks - 1);
        return s;
      }
      if (ev.find("\"error\"") != std::string::npos) return s;
      if (ev.find("\"finish_reason\":null") != std::string::npos) {
        const absl::Time now = absl::Now();
        if (s.chunks == 0) first = now;
        last = now;
        ++s.chunks;
      }
    }
  }
  return s;
}

StreamStats GrpcOne(tessera::v1::Inference::Stub* stub, const tessera::v1::ChatRequest& req) {
  StreamStats s;
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  auto reader = stub->Chat(&ctx, req);
  tessera::v1::GenerateResponse resp;
  absl::Time first, last;
  while (reader->Read(&resp)) {
    if (!resp.has_chunk()) continue;
    if (resp.chunk().text().empty() && resp.chunk().reasoning().empty()) continue;
    const absl::Time now = absl::Now();
    if (s.chunks == 0) first = now;
    last = now;
    ++s.chunks;
  }
  s.ok = reader->Finish().ok() && s.chunks > 0;
  s.ttft_ms = absl::ToDoubleMilliseconds(first - start);
  if (s.chunks > 1) s.per_token_ms = absl::ToDoubleMilliseconds(last - first) / (s.chunks - 1);
  return s;
}

// Runs `n` streams at once; samples the router's threads and memory.
json RunPath(const std::string& name, int n, pid_t router, std::function<StreamStats()> one) {
  std::vector<StreamStats> stats(n);
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  int peak_threads = 0;
  long peak_rss = 0;
  std::thread sampler([&] {
    while (!done.load()) {
      peak_threads = std::max(peak_threads, tt::ThreadCount(router));
      peak_rss = std::max(peak_rss, tt::ResidentKiB(router));
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { stats[i] = one(); });
  for (std::thread& t : threads) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  done = true;
  sampler.join();
  std::vector<double> ttft, tpot;
  int errors = 0;
  long chunks = 0;
  for (const StreamStats& s : stats) {
    if (!s.ok) {
      ++errors;
      continue;
    }
    ttft.push_back(s.ttft_ms);
    if (s.chunks > 1) tpot.push_back(s.per_token_ms);
    chunks += s.chunks;
  }
  return {{"path", name},
          {"streams", n},
          {"errors", errors},
          {"wall_s", wall},
          {"content_chunks", chunks},
          {"ttft_ms", Percentiles(ttft)},
          {"per_token_ms", Percentiles(tpot)},
          {"router_peak_threads", peak_threads},
          {"router_peak_rss_kib", peak_rss}};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::string command = "http_chat_bench";
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command, " ", argv[i]);
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const int n = absl::GetFlag(FLAGS_streams);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  tt::ChatCluster c = tt::StartChatCluster(
      absl::GetFlag(FLAGS_workers),
      {"--max_in_flight=4096", "--max_queue_per_priority=4096", "--http_threads=2"}, false,
      absl::StrCat("decode_step_us=", absl::GetFlag(FLAGS_decode_step_us),
                   ",decode_us_per_seq=5,prefill_us_per_token=1"));
  if (c.http_port() <= 0) {
    std::fprintf(stderr, "the cluster did not start\n");
    return 1;
  }
  const pid_t router = c.cluster.router.process->pid();
  const int idle_threads = tt::ThreadCount(router);
  const long idle_rss = tt::ResidentKiB(router);

  tessera::v1::ChatRequest req;
  auto* m = req.add_messages();
  m->set_role("user");
  m->set_content("Tell me a long story about routers and workers.");
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  const std::string body =
      json({{"model", "default"},
            {"messages",
             {{{"role", "user"}, {"content", "Tell me a long story about routers and workers."}}}},
            {"max_tokens", max_tokens},
            {"ignore_eos", true},
            {"temperature", 0},
            {"stream", true}})
          .dump();
  // Warm-up (connections, the prefix cache).
  GrpcOne(c.cluster.stub.get(), req);
  HttpOne(c.http_port(), body);

  json grpc_path = RunPath("grpc", n, router, [&] { return GrpcOne(c.cluster.stub.get(), req); });
  json http_path = RunPath("http", n, router, [&] { return HttpOne(c.http_port(), body); });
  auto ratio = [&](const char* metric) {
    const double g = grpc_path[metric].value("p99", 0.0);
    const double h = http_path[metric].value("p99", 0.0);
    return g > 0 ? h / g : 0.0;
  };
  json result = {
      {"benchmark", "http_chat_bench"},
      {"command", command},
      {"what",
       "concurrent streaming chat requests, gRPC Chat vs HTTP /v1/chat/completions (SSE), "
       "same router, same simulated workers, one path after the other"},
      {"workers", absl::GetFlag(FLAGS_workers)},
      {"max_tokens", max_tokens},
      {"decode_step_us", absl::GetFlag(FLAGS_decode_step_us)},
      {"router_idle_threads", idle_threads},
      {"router_idle_rss_kib", idle_rss},
      {"note",
       "per_token_ms is the gap between content chunks (a token that completes no text, e.g. a "
       "random id of the simulated model, joins the next chunk); ttft is to the first content "
       "chunk; router threads and RSS are sampled every 20 ms"},
      {"paths", {grpc_path, http_path}},
      {"http_over_grpc_p99", {{"ttft", ratio("ttft_ms")}, {"per_token", ratio("per_token_ms")}}},
  };
  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << text << "\n";
  const bool ok = grpc_path["errors"] == 0 && http_path["errors"] == 0;
  return ok ? 0 : 1;
}
