// Helpers for integration tests that run a local cluster: real
// tessera-worker processes (fixture models or simulated ones) behind a real
// tessera-router on loopback, one stream at a time through the public API,
// and a metric read from a service's /metrics.
//
// Thread-safety: a Cluster is set up and torn down by one test thread;
// RunStream may be called from several threads on one stub.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {

// A simulated worker: 20 ms per decode step (50 tokens/s per stream).
inline constexpr char kSlowSim[] =
    "--simulate=vocab=1024,context=8192,prefill_us_per_token=2,decode_step_us=20000";

// A fixture model directory under tests/fixtures/models/.
std::string Fixture(const std::string& name);

struct Service {
  std::unique_ptr<TestProcess> process;
  int grpc_port = 0;
  int metrics_port = 0;
  int http_port = 0;  // the router's --http_listen port, when it has one
  std::string dir;  // its temporary directory (port file, log)
};

// Starts `binary` (relative to the build tree) on loopback ports it picks
// itself, and waits for its port file.
Service StartService(const std::string& binary, std::vector<std::string> args);

struct Cluster {
  std::vector<Service> workers;
  Service router;
  std::unique_ptr<tessera::v1::Inference::Stub> stub;
};

// One worker per entry of `worker_args` (its flags), then the router; ready
// when ListModels counts every worker healthy.
Cluster StartCluster(const std::vector<std::vector<std::string>>& worker_args,
                     std::vector<std::string> router_args = {}, const std::string& api_key = "");
Cluster StartCluster(int n, const std::vector<std::string>& worker_args,
                     std::vector<std::string> router_args = {}, const std::string& api_key = "");

// A greedy request for `max_tokens` tokens that ignores EOS.
tessera::v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens);

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  tessera::v1::Complete complete;
  bool has_complete = false;
  grpc::Status status;
  std::map<std::string, std::string> trailers;
};

// Runs one stream; `on_token` (optional) sees the token count as it grows.
Result RunStream(tessera::v1::Inference::Stub* stub, const tessera::v1::GenerateRequest& req,
                 std::function<void(int)> on_token = nullptr,
                 grpc::ClientContext* ctx_in = nullptr);

// Streams run on threads of their own, e.g. to be open while the test
// signals a process. The destructor joins them.
class OpenStreams {
 public:
  OpenStreams(tessera::v1::Inference::Stub* stub,
              std::vector<tessera::v1::GenerateRequest> requests);
  ~OpenStreams();
  OpenStreams(const OpenStreams&) = delete;
  OpenStreams& operator=(const OpenStreams&) = delete;
  // True once every stream has its first token (false after `timeout`).
  bool WaitAllStarted(absl::Duration timeout);
  // Waits for every stream to end; their results, in request order.
  std::vector<Result> Join();

 private:
  std::vector<Result> results_;
  std::vector<std::thread> threads_;
  std::atomic<int> started_{0};
};

// The value of the sample `name` (with its labels, as exposed) on a
// service's /metrics; -1 when the page or the sample is missing.
double MetricValue(int port, const std::string& name);

// Writes a byte-level tokenizer.json to `dir` whose ids 0..255 are the bytes.
void WriteByteTokenizer(const std::string& dir);

// Threads and resident memory (KiB) of a process, from /proc; -1 if unknown.
int ThreadCount(pid_t pid);
long ResidentKiB(pid_t pid);

}  // namespace tessera::testing
