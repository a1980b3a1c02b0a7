// `tessera bench`: load-tests a tessera.v1.Inference server (the router) and
// reports latency percentiles and throughput as JSON on stdout (and in
// --out). The load shapes, the workload and the report are described in
// services/cli/bench_lib.h.
//
// Examples:
//   tessera bench --target=127.0.0.1:50051 --concurrency=32 --requests=500
//       --prompt_len=512 --output_len=128
//   tessera bench --target=127.0.0.1:50051 --rate=20 --duration=60s
//       --tenants=16 --system_prompt_tokens=1024 --prompt_len=64:256
//       --tenant_distribution=zipf --use_routing_key --out=bench.json
//
// --target and --seed are shared with `tessera health` and `tessera
// generate` (flags are global to the tool). For bench, --seed=-1 (the
// default) means seed 0, so repeated runs send the same requests.
// Exit status: 0 when at least one request succeeded, 1 otherwise or on a
// usage error.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/cli/bench_lib.h"
#include "services/cli/commands.h"

ABSL_DECLARE_FLAG(std::string, target);  // services/cli/health.cc
ABSL_DECLARE_FLAG(int64_t, seed);        // services/cli/generate.cc

ABSL_FLAG(std::string, api_key, "",
          "bench: API key, sent as 'authorization: Bearer <key>' metadata");
ABSL_FLAG(std::string, bench_model, "", "bench: model name to request; empty = the only model");
ABSL_FLAG(int, concurrency, 0,
          "bench: closed loop with this many concurrent clients (one of --concurrency, --rate)");
ABSL_FLAG(double, rate, 0,
          "bench: open loop at this many requests per second, Poisson arrivals (one of "
          "--concurrency, --rate)");
ABSL_FLAG(int64_t, requests, 0, "bench: requests to send in all (0 = until --duration)");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "bench: stop sending after this long (0 = until --requests); in-flight requests finish");
ABSL_FLAG(std::string, prompt_len, "128",
          "bench: prompt length (the user suffix with --tenants): N, a:b (uniform) or mean~sd "
          "(normal)");
ABSL_FLAG(std::string, output_len, "128",
          "bench: output tokens per request (max_tokens, with ignore_eos): N, a:b or mean~sd");
ABSL_FLAG(std::string, prompt_kind, "token_ids",
          "bench: token_ids (random ids below --vocab) or text (random English words)");
ABSL_FLAG(int, vocab, 1024, "bench: token ids of prompts are drawn from [0, vocab)");
ABSL_FLAG(int, tenants, 0,
          "bench: shared-prefix mode with this many tenants, each with a fixed system prompt");
ABSL_FLAG(int, system_prompt_tokens, 0, "bench: length of each tenant's system prompt");
ABSL_FLAG(std::string, tenant_distribution, "uniform",
          "bench: how requests pick a tenant: uniform or zipf (tenant 0 most popular)");
ABSL_FLAG(double, zipf_exponent, 1.0, "bench: exponent s of the Zipf tenant distribution");
ABSL_FLAG(bool, use_routing_key, false, "bench: send routing_key = tenant-<t> with --tenants");
ABSL_FLAG(int, channels, 1, "bench: gRPC connections to the target, used round-robin");
ABSL_FLAG(int, max_in_flight, 1024, "bench: open loop: at most this many requests in flight");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(10), "bench: deadline of each request");
ABSL_FLAG(std::string, out, "", "bench: also write the JSON report to this file");

namespace tessera::cli {

int RunBench(const std::vector<char*>&) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  bench::BenchOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  o.api_key = absl::GetFlag(FLAGS_api_key);
  o.model = absl::GetFlag(FLAGS_bench_model);
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.rate = absl::GetFlag(FLAGS_rate);
  o.requests = absl::GetFlag(FLAGS_requests);
  o.duration = absl::GetFlag(FLAGS_duration);
  auto prompt_len = bench::LengthDistribution::Parse(absl::GetFlag(FLAGS_prompt_len));
  if (!prompt_len.ok()) return fail(prompt_len.status());
  o.prompt_len = *prompt_len;
  auto output_len = bench::LengthDistribution::Parse(absl::GetFlag(FLAGS_output_len));
  if (!output_len.ok()) return fail(output_len.status());
  o.output_len = *output_len;
  const std::string kind = absl::GetFlag(FLAGS_prompt_kind);
  if (kind == "token_ids") {
    o.prompt_kind = bench::PromptKind::kTokenIds;
  } else if (kind == "text") {
    o.prompt_kind = bench::PromptKind::kText;
  } else {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--prompt_kind=", kind, ": expected token_ids or text")));
  }
  o.vocab = absl::GetFlag(FLAGS_vocab);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  o.seed = seed < 0 ? 0 : static_cast<uint64_t>(seed);
  o.tenants = absl::GetFlag(FLAGS_tenants);
  o.system_prompt_tokens = absl::GetFlag(FLAGS_system_prompt_tokens);
  const std::string dist = absl::GetFlag(FLAGS_tenant_distribution);
  if (dist == "uniform") {
    o.tenant_distribution = bench::TenantDistribution::kUniform;
  } else if (dist == "zipf") {
    o.tenant_distribution = bench::TenantDistribution::kZipf;
  } else {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--tenant_distribution=", dist, ": expected uniform or zipf")));
  }
  o.zipf_exponent = absl::GetFlag(FLAGS_zipf_exponent);
  o.use_routing_key = absl::GetFlag(FLAGS_use_routing_key);
  o.channels = absl::GetFlag(FLAGS_channels);
  o.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  o.request_timeout = absl::GetFlag(FLAGS_timeout);
  if (auto s = bench::ValidateBenchOptions(o); !s.ok()) return fail(s);

  auto result = bench::RunLoad(o);
  if (!result.ok()) return fail(result.status());
  const std::string report = bench::ReportJson(o, *result).dump(2);
  std::printf("%s\n", report.c_str());
  std::fflush(stdout);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::ofstream f(out);
    f << report << "\n";
    f.close();
    if (!f) return fail(absl::UnavailableError(absl::StrCat("cannot write ", out)));
  }
  std::fprintf(stderr,
               "%lld sent, %lld succeeded, %lld resource-exhausted, %lld failed in %.2f s\n",
               static_cast<long long>(result->sent), static_cast<long long>(result->succeeded),
               static_cast<long long>(result->resource_exhausted),
               static_cast<long long>(result->failed), absl::ToDoubleSeconds(result->duration));
  return result->succeeded > 0 ? 0 : 1;
}

}  // namespace tessera::cli
