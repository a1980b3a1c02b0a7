// http_chat_bench: many concurrent streaming chat requests through a real
// tessera-router and simulated workers, over the gRPC Chat RPC and over the
// HTTP API (/v1/chat/completions, SSE), in one run, one path after the
// other with the same load, in --rounds rounds. Reports, per path: errors, time to first token
// and the gap between tokens (p50/p99), and the router's peak threads and
// resident memory; and the HTTP path's p99 over the gRPC path's.
//
//   http_chat_bench --streams=1000 --workers=4 --max_tokens=64 --out=result.json
//
// Both client sides are asynchronous (http_chat_bench_clients.h): Beast on
// --client_threads event-loop threads for HTTP, gRPC's callback API for
// gRPC, each on connections opened before the streams start. So the
// latencies are the router's and the workers', not those of a thousand
// client threads waiting for a core.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "tests/bench/http_chat_bench_clients.h"
#include "tests/integration/chat_fixture.h"

ABSL_FLAG(int, streams, 1000, "Concurrent streams per path");
ABSL_FLAG(int, workers, 4, "Simulated workers");
ABSL_FLAG(int, max_tokens, 64, "Tokens per stream");
ABSL_FLAG(int, decode_step_us, 20000, "Simulated decode step (per batch)");
ABSL_FLAG(int, client_threads, 2, "Event-loop threads of the HTTP client");
ABSL_FLAG(std::string, worker_flags, "--max_num_seqs=1024 --kv_cache_blocks=20000",
          "Flags added to each worker's, space-separated. The default lets every stream decode "
          "at once even where prefix-aware routing sends most of the (identical) prompts to one "
          "worker, so time to first token is not a wait for a batch slot or for KV blocks");
ABSL_FLAG(int, router_http_threads, 4,
          "The router's --http_threads (its default, 4). When the machine is saturated, the "
          "kernel shares the cores per runnable thread, and gRPC's server runs on more threads "
          "than 2; with 4 the two paths get a like share of the 2-core dev VM");
ABSL_FLAG(int, rounds, 3, "Rounds of both paths (their order alternates)");
ABSL_FLAG(std::string, out, "", "Write the JSON result here (and print it)");

namespace tt = tessera::testing;
namespace tb = tessera::bench;
using nlohmann::json;

namespace {

json Percentiles(std::vector<double> v) {
  if (v.empty()) return json::object();
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {{"p50", at(0.50)}, {"p90", at(0.90)}, {"p99", at(0.99)}, {"max", v.back()}};
}

// Peak threads and resident memory of a process, sampled every 20 ms from
// construction to Stop().
class PeakSampler {
 public:
  explicit PeakSampler(pid_t pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            threads_ = std::max(threads_, tt::ThreadCount(pid));
            rss_kib_ = std::max(rss_kib_, tt::ResidentKiB(pid));
            absl::SleepFor(absl::Milliseconds(20));
          }
        }) {}
  void Stop() {
    stop_ = true;
    thread_.join();
  }
  int threads() const { return threads_; }
  long rss_kib() const { return rss_kib_; }

 private:
  std::atomic<bool> stop_{false};
  int threads_ = 0;
  long rss_kib_ = 0;
  std::thread thread_;
};

// TTFT, the gaps between content chunks (all streams pooled), errors.
json Summarize(const std::vector<tb::StreamTimes>& streams) {
  std::vector<double> ttft, gaps;
  int errors = 0;
  long chunks = 0;
  std::string first_error;
  for (const tb::StreamTimes& s : streams) {
    if (!s.ok) {
      if (errors++ == 0) first_error = s.error;
      continue;
    }
    ttft.push_back(absl::ToDoubleMilliseconds(s.chunks.front() - s.start));
    for (size_t i = 1; i < s.chunks.size(); ++i) {
      gaps.push_back(absl::ToDoubleMilliseconds(s.chunks[i] - s.chunks[i - 1]));
    }
    chunks += static_cast<long>(s.chunks.size());
  }
  json out = {{"errors", errors},
              {"content_chunks", chunks},
              {"ttft_ms", Percentiles(ttft)},
              {"inter_token_ms", Percentiles(gaps)}};
  if (errors > 0) out["first_error"] = first_error;
  return out;
}

// One path's streams over all rounds, and the router's peaks while they ran.
struct PathRuns {
  std::vector<tb::StreamTimes> streams;
  std::vector<double> wall_s;
  std::vector<double> ttft_p99_ms, inter_token_p99_ms;  // per round
  int peak_threads = 0;
  long peak_rss_kib = 0;
};

double P99(const json& percentiles) { return percentiles.value("p99", 0.0); }

// Runs one round of a path's streams into `runs`.
void RunRound(pid_t router, const std::function<std::vector<tb::StreamTimes>()>& run,
              PathRuns* runs) {
  PeakSampler peaks(router);
  const absl::Time start = absl::Now();
  std::vector<tb::StreamTimes> streams = run();
  runs->wall_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  peaks.Stop();
  runs->peak_threads = std::max(runs->peak_threads, peaks.threads());
  runs->peak_rss_kib = std::max(runs->peak_rss_kib, peaks.rss_kib());
  const json round = Summarize(streams);
  runs->ttft_p99_ms.push_back(P99(round["ttft_ms"]));
  runs->inter_token_p99_ms.push_back(P99(round["inter_token_ms"]));
  for (tb::StreamTimes& s : streams) runs->streams.push_back(std::move(s));
}

json PathJson(const std::string& name, int n, const PathRuns& runs) {
  json out = Summarize(runs.streams);
  out["path"] = name;
  out["streams_per_round"] = n;
  out["wall_s"] = runs.wall_s;
  out["round_ttft_p99_ms"] = runs.ttft_p99_ms;
  out["round_inter_token_p99_ms"] = runs.inter_token_p99_ms;
  out["router_peak_threads"] = runs.peak_threads;
  out["router_peak_rss_kib"] = runs.peak_rss_kib;
  return out;
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
      {"--max_in_flight=4096", "--max_queue_per_priority=4096",
       absl::StrCat("--http_threads=", absl::GetFlag(FLAGS_router_http_threads))},
      false,
      absl::StrCat("decode_step_us=", absl::GetFlag(FLAGS_decode_step_us),
                   ",decode_us_per_seq=5,prefill_us_per_token=1"),
      "", absl::StrSplit(absl::GetFlag(FLAGS_worker_flags), ' ', absl::SkipEmpty()));
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
  const int client_threads = absl::GetFlag(FLAGS_client_threads);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  auto grpc_run = [&](int k) { return tb::RunGrpcStreams(c.cluster.stub.get(), req, k); };
  auto http_run = [&](int k) { return tb::RunHttpStreams(c.http_port(), body, k, client_threads); };
  // Warm-up: the channel, the prefix cache, the router's first allocations.
  grpc_run(8);
  http_run(8);

  // Rounds alternate which path goes first, so that neither always runs on
  // a router the other has just warmed (or left busy).
  PathRuns grpc_runs, http_runs;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      RunRound(
          router, [&] { return grpc_run(n); }, &grpc_runs);
      RunRound(
          router, [&] { return http_run(n); }, &http_runs);
    } else {
      RunRound(
          router, [&] { return http_run(n); }, &http_runs);
      RunRound(
          router, [&] { return grpc_run(n); }, &grpc_runs);
    }
  }
  const json grpc_path = PathJson("grpc", n, grpc_runs);
  const json http_path = PathJson("http", n, http_runs);
  auto ratio = [&](const char* metric) {
    const double g = P99(grpc_path[metric]);
    return g > 0 ? P99(http_path[metric]) / g : 0.0;
  };
  json result = {
      {"benchmark", "http_chat_bench"},
      {"command", command},
      {"what",
       "concurrent streaming chat requests, gRPC Chat vs HTTP /v1/chat/completions (SSE), "
       "same router, same simulated workers, one path after the other, in rounds that "
       "alternate which goes first; percentiles pool all rounds"},
      {"workers", absl::GetFlag(FLAGS_workers)},
      {"max_tokens", max_tokens},
      {"decode_step_us", absl::GetFlag(FLAGS_decode_step_us)},
      {"worker_flags", absl::GetFlag(FLAGS_worker_flags)},
      {"router_idle_threads", idle_threads},
      {"router_idle_rss_kib", idle_rss},
      {"client_threads_http", client_threads},
      {"router_http_threads", absl::GetFlag(FLAGS_router_http_threads)},
      {"rounds", rounds},
      {"note",
       "both clients are asynchronous (Beast event loops for HTTP, gRPC's callback API), on "
       "connections opened before the streams start; ttft_ms is from the request write (HTTP) "
       "or the call (gRPC) to the first content chunk; inter_token_ms pools the gaps between "
       "content chunks of all streams (a token that completes no text, e.g. a random id of "
       "the simulated model, joins the next chunk); router threads and RSS are sampled every "
       "20 ms"},
      {"paths", {grpc_path, http_path}},
      {"http_over_grpc_p99",
       {{"ttft", ratio("ttft_ms")}, {"inter_token", ratio("inter_token_ms")}, {"target", 1.10}}},
  };
  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << text << "\n";
  const bool ok = grpc_path["errors"] == 0 && http_path["errors"] == 0;
  return ok ? 0 : 1;
}
