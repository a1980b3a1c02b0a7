// The load generator behind `tessera bench`: drives a tessera.v1.Inference
// server (the router) with generated requests and measures, per request,
// time to first token (TTFT), inter-token latency (ITL) and end-to-end
// latency (E2E), then summarizes them (mean, p50, p90, p99) with throughput
// and error counts as JSON.
//
// Load shapes:
//   - closed loop: `concurrency` clients, each sending its next request as
//     soon as the previous one ends, until `requests` were sent or
//     `duration` has passed;
//   - open loop: requests arrive as a Poisson process of `rate` per second
//     (exponential gaps from the seeded generator), whatever the server's
//     speed, until `requests` or `duration`. Latencies are measured from the
//     scheduled arrival, so time a request waits for a free client thread
//     (at most `max_in_flight` in flight) counts against the server rather
//     than being hidden (no coordinated omission).
// Both use the synchronous gRPC client, one thread per request in flight.
//
// Workload: request i is a pure function of (options, seed, i) — the same
// seed gives the same requests in the same order, whatever the timing.
// Prompts are token ids drawn uniformly below `vocab`, or text of random
// common English words (about one BPE token each). Sampling is greedy with
// ignore_eos and max_tokens = the drawn output length, so every successful
// request generates exactly that many tokens. Shared-prefix multi-tenant mode
// (`tenants` > 0): each request picks a tenant (uniform or Zipf, tenant 0
// the most popular), and its prompt is that tenant's fixed
// `system_prompt_tokens`-long system prompt followed by a random user suffix
// whose length is drawn from `prompt_len`; with `use_routing_key` the
// request carries routing_key "tenant-<t>".
//
// Measurements: TTFT = arrival → first chunk with tokens; each later chunk
// of k tokens arriving g after the previous one adds k ITL samples of g / k;
// E2E = arrival → end of stream. A request succeeds when its stream ends OK
// after a `complete` message with finish reason LENGTH or STOP; latency
// summaries and token throughput count successful requests only. Failures
// are counted by gRPC status code name ("UNAVAILABLE", ...), except
// RESOURCE_EXHAUSTED (admission refusals), counted apart; a stream that ends
// OK without `complete` counts as "NO_COMPLETE", one whose `complete` has
// another finish reason as "FINISH_<REASON>" (e.g. "FINISH_ERROR").
//
// Thread-safety: RunLoad may be called from any thread; it starts and joins
// its own threads. The other functions are pure or const.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tessera::cli::bench {

// A distribution of lengths (tokens, or words for text prompts):
//   "N"        fixed N;
//   "a:b"      uniform integer in [a, b];
//   "mean~sd"  normal, rounded, clamped to >= 1.
// Values must be >= 1 (sd >= 0).
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double a = 1;  // fixed value, uniform low, or mean
  double b = 0;  // uniform high, or standard deviation

  static absl::StatusOr<LengthDistribution> Parse(std::string_view spec);
  int Sample(std::mt19937_64& rng) const;
  std::string ToString() const;  // the spec it parses from
};

enum class PromptKind { kTokenIds, kText };
enum class TenantDistribution { kUniform, kZipf };

struct BenchOptions {
  std::string target;   // host:port of a tessera.v1.Inference server
  std::string api_key;  // sent as "authorization: Bearer <key>" when set
  std::string model;    // GenerateRequest.model; empty = the only model
  // Exactly one of: closed loop with `concurrency` clients, or open loop at
  // `rate` requests per second.
  int concurrency = 0;
  double rate = 0;
  // Stop after this many requests (0 = no limit) or this much time
  // (zero = no limit); at least one must be set. In-flight requests finish.
  int64_t requests = 0;
  absl::Duration duration = absl::ZeroDuration();
  LengthDistribution prompt_len;  // the user suffix in tenant mode
  LengthDistribution output_len;
  PromptKind prompt_kind = PromptKind::kTokenIds;
  int vocab = 1024;  // token ids are drawn from [0, vocab)
  uint64_t seed = 0;
  int tenants = 0;  // > 0: shared-prefix multi-tenant mode
  int system_prompt_tokens = 0;
  TenantDistribution tenant_distribution = TenantDistribution::kUniform;
  double zipf_exponent = 1.0;
  bool use_routing_key = false;
  int channels = 1;          // gRPC connections, used round-robin
  int max_in_flight = 1024;  // open loop: client threads at most
  absl::Duration request_timeout = absl::Minutes(10);
};

// INVALID_ARGUMENT naming the first inconsistent or out-of-range option.
absl::Status ValidateBenchOptions(const BenchOptions& options);

// One generated request.
struct PlannedRequest {
  int64_t index = 0;
  int tenant = -1;                 // -1 outside tenant mode
  std::vector<int32_t> token_ids;  // PromptKind::kTokenIds
  std::string text;                // PromptKind::kText
  int prompt_len = 0;              // tokens (or words) including the system prompt
  int max_tokens = 0;
  std::string routing_key;  // "tenant-<t>" with use_routing_key
};

// Generates requests: Make(i) depends only on the options and i.
class Workload {
 public:
  // REQUIRES: ValidateBenchOptions(options) is OK.
  explicit Workload(const BenchOptions& options);

  PlannedRequest Make(int64_t index) const;
  // Tenant t's system prompt (ids, or words for text prompts).
  const std::vector<int32_t>& SystemPromptIds(int tenant) const { return system_ids_[tenant]; }
  const std::string& SystemPromptText(int tenant) const { return system_text_[tenant]; }
  // Draws a tenant (uniform or Zipf).
  int PickTenant(std::mt19937_64& rng) const;

 private:
  BenchOptions options_;
  std::vector<std::vector<int32_t>> system_ids_;
  std::vector<std::string> system_text_;
  std::vector<double> tenant_cdf_;  // Zipf: cumulative weights
};

// Poisson arrivals: Next() returns the offset of each arrival from the
// start: 0 for the first, then gaps exponential with mean 1 / rate.
class ArrivalSchedule {
 public:
  ArrivalSchedule(double rate, uint64_t seed);
  absl::Duration Next();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  double t_ = 0;  // seconds
};

// Linear interpolation between closest ranks (numpy's default), p in
// [0, 100]. REQUIRES: `sorted` is sorted and not empty.
double Percentile(const std::vector<double>& sorted, double p);

struct LatencySummary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
LatencySummary Summarize(std::vector<double> values);

// What one request did.
struct RequestRecord {
  int64_t index = 0;
  int tenant = -1;
  int status_code = 0;  // grpc::StatusCode
  std::string error;    // "" when successful, else the counting key
  std::string error_message;
  bool succeeded = false;
  std::optional<double> ttft_ms;
  double e2e_ms = 0;
  std::vector<double> itl_ms;
  int output_tokens = 0;  // token ids received
  int max_tokens = 0;     // asked for
  int prompt_tokens = 0;  // from the final usage
  int cached_tokens = 0;  // from the final usage
};

struct BenchResult {
  absl::Duration duration;  // start → last request's end
  int64_t sent = 0;
  int64_t succeeded = 0;
  int64_t resource_exhausted = 0;
  int64_t failed = 0;                     // other failures
  std::map<std::string, int64_t> errors;  // other failures by key
  // The first message seen for each failure key (RESOURCE_EXHAUSTED too).
  std::map<std::string, std::string> error_examples;
  int64_t prompt_tokens = 0;  // successful requests, from usage
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  int64_t length_mismatches = 0;  // successful, but output != max_tokens
  LatencySummary ttft_ms, itl_ms, e2e_ms;
  std::vector<RequestRecord> records;  // in index order
};

// Runs the load against options.target. Fails only for invalid options; a
// server that cannot be reached shows as failed requests ("UNAVAILABLE").
absl::StatusOr<BenchResult> RunLoad(const BenchOptions& options);

// The report (times in ms, throughputs per second):
//   config: the options (target, model, mode "closed"|"open", concurrency or
//     rate and max_in_flight, requests, duration_s, prompt_len, output_len,
//     prompt_kind "token_ids"|"text", vocab, seed, tenants and, with tenants,
//     system_prompt_tokens, tenant_distribution, zipf_exponent,
//     use_routing_key; channels; api_key: whether one was sent)
//   duration_s: start to the last request's end
//   requests: {sent, succeeded, resource_exhausted, failed}
//   errors: {key: count} for the failures other than RESOURCE_EXHAUSTED
//   error_examples: {key: the first message seen}, RESOURCE_EXHAUSTED too
//   request_throughput: succeeded / duration_s
//   output_token_throughput: output tokens of successful requests / duration_s
//   tokens: {prompt, cached, output, cached_fraction} (successful requests;
//     prompt and cached from the servers' usage)
//   length_mismatches: successful requests whose output length differs from
//     the max_tokens they asked for
//   ttft_ms, itl_ms, e2e_ms: {count, mean, p50, p90, p99, min, max}; the
//     statistics are null when count is 0
nlohmann::json ReportJson(const BenchOptions& options, const BenchResult& result);

}  // namespace tessera::cli::bench
