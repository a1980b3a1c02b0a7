// Continuous batching vs one request at a time, in-process on the CPU
// engine (the same engine tessera-worker runs), on a random bf16 model:
// N requests with P-token prompts and G generated tokens each.
//
// Usage: engine_batching_bench [--requests=32] [--prompt=64] [--generate=64] [--out=FILE]
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "tests/bench/bench_util.h"
#include "worker/engine/local_engine.h"

ABSL_FLAG(int, requests, 32, "number of requests");
ABSL_FLAG(int, prompt, 64, "prompt tokens per request");
ABSL_FLAG(int, generate, 64, "generated tokens per request");
ABSL_FLAG(std::string, out, "tests/bench/results/engine_batching_cpu.json", "result JSON");

namespace {

using tessera::engine::EngineRequest;
using tessera::engine::StreamEvent;

struct RunStats {
  double seconds = 0;
  double output_tokens_per_second = 0;
  double mean_latency_seconds = 0;
};

// Waits for one stream to finish; returns its latency from `start`.
double Drain(tessera::engine::RequestStream& s, absl::Time start) {
  StreamEvent e;
  while (s.Next(&e, absl::Seconds(600))) {
    if (e.finished) break;
  }
  if (!e.error.ok() || !e.finished) {
    std::fprintf(stderr, "request failed: %s\n", e.error.ToString().c_str());
    std::exit(1);
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

RunStats Run(tessera::engine::Engine& engine, const std::vector<EngineRequest>& requests,
             bool concurrent) {
  absl::Time start = absl::Now();
  double latency_sum = 0;
  if (concurrent) {
    std::vector<std::shared_ptr<tessera::engine::RequestStream>> streams;
    for (const EngineRequest& r : requests) streams.push_back(*engine.Submit(r));
    for (auto& s : streams) latency_sum += Drain(*s, start);
  } else {
    for (const EngineRequest& r : requests) {
      absl::Time t = absl::Now();
      latency_sum += Drain(**engine.Submit(r), t);
    }
  }
  RunStats st;
  st.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  st.output_tokens_per_second = requests.size() * requests[0].max_tokens / st.seconds;
  st.mean_latency_seconds = latency_sum / requests.size();
  return st;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tessera::runner::TestModelSpec spec;
  spec.vocab = 8192;
  spec.hidden = 512;
  spec.intermediate = 1536;
  spec.layers = 8;
  spec.heads = 8;
  spec.kv_heads = 4;
  spec.head_dim = 64;
  spec.dtype = tessera::model::DType::kBF16;
  std::string dir = tessera::bench::MakeRandomModel(spec);

  tessera::engine::LocalEngineOptions lo;
  lo.model_dir = dir;
  lo.kv_cache_memory_mb = 1024;
  lo.max_num_seqs = 64;
  lo.enable_prefix_caching = false;  // distinct prompts; measure batching alone
  auto local = tessera::engine::BuildLocalEngine(lo);
  if (!local.ok()) {
    std::fprintf(stderr, "%s\n", local.status().ToString().c_str());
    return 1;
  }
  tessera::engine::Engine& engine = *(*local)->engine;
  engine.Start();

  std::mt19937 rng(42);
  std::vector<EngineRequest> requests(absl::GetFlag(FLAGS_requests));
  for (EngineRequest& r : requests) {
    for (int i = 0; i < absl::GetFlag(FLAGS_prompt); ++i) {
      r.prompt.push_back(static_cast<int32_t>(rng() % spec.vocab));
    }
    r.max_tokens = absl::GetFlag(FLAGS_generate);
    r.ignore_eos = true;
    r.sampling.temperature = 0;
  }
  // Warm-up (page in weights) with one request.
  Run(engine, {requests[0]}, false);
  RunStats sequential = Run(engine, requests, false);
  RunStats batched = Run(engine, requests, true);

  nlohmann::json result = {
      {"what", "continuous batching vs one request at a time, CPU engine, greedy"},
      {"model",
       {{"parameters", tessera::bench::ParameterCount(spec)},
        {"hidden", spec.hidden},
        {"layers", spec.layers},
        {"vocab", spec.vocab},
        {"weights_dtype", "bf16"}}},
      {"requests", requests.size()},
      {"prompt_tokens", absl::GetFlag(FLAGS_prompt)},
      {"generated_tokens", absl::GetFlag(FLAGS_generate)},
      {"one_at_a_time",
       {{"seconds", sequential.seconds},
        {"output_tokens_per_second", sequential.output_tokens_per_second},
        {"mean_latency_seconds", sequential.mean_latency_seconds}}},
      {"continuous_batching",
       {{"seconds", batched.seconds},
        {"output_tokens_per_second", batched.output_tokens_per_second},
        {"mean_latency_seconds", batched.mean_latency_seconds}}},
      {"throughput_ratio", batched.output_tokens_per_second / sequential.output_tokens_per_second},
      {"backends", (*local)->backends.device},
  };
  std::printf("%s\n", result.dump(2).c_str());
  tessera::bench::WriteResult(absl::GetFlag(FLAGS_out), argc, argv, result);
  return 0;
}
