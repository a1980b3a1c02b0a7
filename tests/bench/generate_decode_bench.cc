// Decode speed of `tessera generate` on a small random bf16 model on this
// machine's CPU, against the memory-bandwidth roofline: each decode step
// reads every weight once (plus the KV cache), so tokens/s can be at most
// read bandwidth / bytes per step. Runs the real `tessera` binary.
//
// Usage: generate_decode_bench --tessera=PATH [--out=FILE] [--tokens=N]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "tests/bench/bench_util.h"

ABSL_FLAG(std::string, tessera, "", "path of the tessera binary");
ABSL_FLAG(std::string, out, "tests/bench/results/generate_decode_cpu.json", "result JSON");
ABSL_FLAG(int, tokens, 64, "tokens to generate");

// A fixed prompt of n token ids (the model is random: ids are as good as text).
std::string PromptIds(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += absl::StrCat(i ? "," : "", 100 + 37 * i);
  return s;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using tessera::bench::ParameterCount;
  tessera::runner::TestModelSpec spec;
  spec.architecture = "Qwen3ForCausalLM";
  spec.vocab = 32000;
  spec.hidden = 1024;
  spec.intermediate = 3072;
  spec.layers = 12;
  spec.heads = 16;
  spec.kv_heads = 8;
  spec.head_dim = 64;
  spec.tie_embeddings = true;
  spec.dtype = tessera::model::DType::kBF16;
  std::string dir = tessera::bench::MakeRandomModel(spec);
  const int64_t params = ParameterCount(spec);
  const double weight_bytes = 2.0 * params;
  std::printf("model: %lld parameters (%.1f MB bf16) in %s\n", static_cast<long long>(params),
              weight_bytes / 1e6, dir.c_str());

  double copy_bw = tessera::bench::MeasureCopyBandwidth();
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  double read_bw = tessera::bench::MeasureReadBandwidth(threads);
  std::string stats = dir + "/stats.json";
  std::string cmd =
      absl::StrCat(absl::GetFlag(FLAGS_tessera), " generate --model=", dir,
                   " --prompt_ids=", PromptIds(32), " --max_tokens=", absl::GetFlag(FLAGS_tokens),
                   " --ignore_eos --stats_json=", stats, " > /dev/null");
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "tessera generate failed: %s\n", cmd.c_str());
    return 1;
  }
  std::ifstream in(stats);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json gen = nlohmann::json::parse(ss.str());
  const double tps = gen["decode_tokens_per_second"].get<double>();
  // KV read per step at the mean context (fp32 cache), small next to weights.
  const int ctx = gen["prompt_tokens"].get<int>() + absl::GetFlag(FLAGS_tokens) / 2;
  const double kv_bytes = 2.0 * spec.layers * spec.kv_heads * spec.head_dim * 4.0 * ctx;
  const double bytes_per_token = weight_bytes + kv_bytes;
  // Decode streams its weights (reads only): the read bandwidth is the ceiling.
  const double roofline_tps = read_bw / bytes_per_token;
  nlohmann::json result = {
      {"what", "decode tokens/s of `tessera generate` (CPU, batch 1) vs the memory-read roofline"},
      {"model",
       {{"architecture", spec.architecture},
        {"parameters", params},
        {"hidden", spec.hidden},
        {"layers", spec.layers},
        {"vocab", spec.vocab},
        {"weights_dtype", "bf16"},
        {"weight_bytes", weight_bytes}}},
      {"read_bandwidth_GBps", read_bw / 1e9},
      {"read_bandwidth_threads", threads},
      {"copy_bandwidth_GBps_read_plus_write", copy_bw / 1e9},
      {"bytes_per_decode_step", bytes_per_token},
      {"roofline_tokens_per_second", roofline_tps},
      {"decode_tokens_per_second", tps},
      {"fraction_of_roofline", tps / roofline_tps},
      {"effective_bandwidth_GBps", tps * bytes_per_token / 1e9},
      {"generate_stats", gen},
  };
  result["generate_stats"].erase("backends");
  std::printf("%s\n", result.dump(2).c_str());
  tessera::bench::WriteResult(absl::GetFlag(FLAGS_out), argc, argv, result);
  return 0;
}
