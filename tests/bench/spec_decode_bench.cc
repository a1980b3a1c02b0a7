// Speculative decoding on the CPU engine (in-process, the engine
// tessera-worker runs): acceptance and speed against plain decoding, per
// draft source (n-gram, suffix automaton, draft model), greedy, one request
// at a time (batch 1) and `--batch` requests at once.
//
// Models: --target and --draft (directories). By default models/target and
// models/draft when they exist (the trained pair; prompts are held-out
// Python texts from --prompts); otherwise a generated pair: a random bf16
// target with tied embeddings and, as its draft, the target's first layer
// (same seed, so the two agree often). The result names which was used.
//
// --device runs the target elsewhere (e.g. cuda); --draft_device the draft
// model source (default cpu).
//
// Each run reports wall-clock speed and, less sensitive to other jobs on a
// shared machine, the process's CPU seconds (the least of the repeats;
// cpu_time_speedup_vs_plain).
//
// --tree_branching=B (> 1) adds, per source, a run with token trees (at most
// B candidates per position; the draft model's runner-up tokens as siblings
// at its first --tree_depth positions), verified in one pass with the tree
// attention mask; the chain runs stay for comparison.
//
// Usage: spec_decode_bench [--requests=8] [--generate=128] [--batch=8] [--k=4] [--repeats=2]
//                          [--tree_branching=0] [--tree_depth=1] [--out=FILE]
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "tests/bench/bench_util.h"
#include "worker/engine/local_engine.h"
#include "worker/spec/model_source.h"

ABSL_FLAG(std::string, target, "", "target model directory (default: models/target or generated)");
ABSL_FLAG(std::string, draft, "", "draft model directory (default: models/draft or generated)");
ABSL_FLAG(std::string, prompts, "models/fixtures/tokenizer_expected.json",
          "JSON list of {text, ids}: prompts for the trained pair (the first --prompt ids of "
          "texts at least that long)");
ABSL_FLAG(int, requests, 8, "requests per run");
ABSL_FLAG(int, prompt, 64, "prompt tokens per request");
ABSL_FLAG(int, generate, 128, "generated tokens per request");
ABSL_FLAG(int, batch, 8, "requests at once in the batched runs");
ABSL_FLAG(int, k, 4, "most draft tokens per step (adaptive)");
ABSL_FLAG(std::string, device, "cpu",
          "device of the target (cpu, cuda, cuda:<bus id>); the draft model runs on the CPU");
ABSL_FLAG(double, temperature, 0,
          "sampling temperature (0 = greedy); above 0 each request has a fixed seed and outputs "
          "are compared in distribution by the tests, not token by token here");
ABSL_FLAG(std::string, draft_device, "cpu",
          "device of the draft model source (cpu, cuda, cuda:<bus id>)");
ABSL_FLAG(int, tree_branching, 0,
          "above 1: also run each source with token trees of this branching");
ABSL_FLAG(int, tree_depth, 1, "draft model trees: positions that get siblings");
ABSL_FLAG(int, repeats, 2, "fresh engines per configuration; the fastest run counts");
ABSL_FLAG(std::string, out, "tests/bench/results/spec_decode_cpu.json", "result JSON");

namespace {

using tessera::engine::EngineRequest;
using tessera::engine::StreamEvent;

// The 1-minute load average (the machine is shared; speeds vary with it).
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

class Counter final : public tessera::engine::EngineObserver {
 public:
  void OnDraftVerified(int proposed, int accepted) override {
    ++drafts;
    draft_tokens += proposed;
    accepted_tokens += accepted;
  }
  int64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
};

// CPU seconds this process has used (all threads): less sensitive than wall
// time to other jobs on a shared machine.
double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct RunResult {
  double seconds = 0;
  double cpu_seconds = 0;
  std::vector<std::vector<int32_t>> outputs;
};

RunResult Run(tessera::engine::Engine& engine, const std::vector<EngineRequest>& requests,
              int batch) {
  RunResult r;
  r.outputs.resize(requests.size());
  const double cpu_start = CpuSeconds();
  absl::Time start = absl::Now();
  for (size_t first = 0; first < requests.size(); first += batch) {
    std::vector<std::shared_ptr<tessera::engine::RequestStream>> streams;
    for (size_t i = first; i < std::min(requests.size(), first + batch); ++i) {
      streams.push_back(*engine.Submit(requests[i]));
    }
    for (size_t j = 0; j < streams.size(); ++j) {
      StreamEvent e;
      while (streams[j]->Next(&e, absl::Seconds(600))) {
        for (const auto& t : e.tokens) r.outputs[first + j].push_back(t.token);
        if (e.finished) break;
      }
      if (!e.error.ok()) {
        std::fprintf(stderr, "request failed: %s\n", e.error.ToString().c_str());
        std::exit(1);
      }
    }
  }
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  r.cpu_seconds = CpuSeconds() - cpu_start;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string target = absl::GetFlag(FLAGS_target), draft = absl::GetFlag(FLAGS_draft);
  std::string models = "given";
  if (target.empty() && IsDir("models/target") && IsDir("models/draft")) {
    target = "models/target";
    draft = "models/draft";
    models = "trained pair (models/target, models/draft)";
  }
  tessera::runner::TestModelSpec spec;
  if (target.empty()) {
    spec.vocab = 8192;
    spec.hidden = 512;
    spec.intermediate = 1536;
    spec.layers = 8;
    spec.heads = 8;
    spec.kv_heads = 4;
    spec.head_dim = 64;
    spec.tie_embeddings = true;
    spec.weight_scale = 0.08f;
    spec.dtype = tessera::model::DType::kBF16;
    target = tessera::bench::MakeRandomModel(spec);
    tessera::runner::TestModelSpec d = spec;
    d.layers = 1;
    draft = tessera::bench::MakeRandomModel(d);
    models =
        "generated: random bf16 target (8 layers, hidden 512, vocab 8192, tied embeddings); "
        "draft = its first layer (no trained pair under models/)";
  }

  std::mt19937 rng(42);
  std::vector<EngineRequest> requests(absl::GetFlag(FLAGS_requests));
  std::string prompts_from = "random tokens: a 16-token phrase three times, then fresh tokens";
  const bool trained = models.rfind("trained", 0) == 0;
  if (trained) {
    std::ifstream in(absl::GetFlag(FLAGS_prompts));
    nlohmann::json cases = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    size_t next = 0;
    for (const auto& c : cases.is_array() ? cases : nlohmann::json::array()) {
      if (next == requests.size()) break;
      const auto ids = c.value("ids", std::vector<int32_t>());
      if (static_cast<int>(ids.size()) < absl::GetFlag(FLAGS_prompt)) continue;
      requests[next++].prompt.assign(ids.begin(), ids.begin() + absl::GetFlag(FLAGS_prompt));
    }
    if (next < requests.size()) {
      std::fprintf(stderr, "%s: not enough prompts of %d tokens\n",
                   absl::GetFlag(FLAGS_prompts).c_str(), absl::GetFlag(FLAGS_prompt));
      return 1;
    }
    prompts_from = "Python sources from " + absl::GetFlag(FLAGS_prompts) + " (held-out texts)";
  }
  for (EngineRequest& r : requests) {
    // A phrase repeated a few times, then fresh tokens: some material for
    // the model-free sources, as in code or chat with quoting.
    std::vector<int32_t> phrase(16);
    for (auto& t : phrase) t = static_cast<int32_t>(3 + rng() % 4000);
    while (!trained && static_cast<int>(r.prompt.size()) < absl::GetFlag(FLAGS_prompt)) {
      if (r.prompt.size() < 48) {
        r.prompt.insert(r.prompt.end(), phrase.begin(), phrase.end());
      } else {
        r.prompt.push_back(static_cast<int32_t>(3 + rng() % 4000));
      }
    }
    r.max_tokens = absl::GetFlag(FLAGS_generate);
    r.ignore_eos = true;
    r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
    r.sampling.seed = 1000 + static_cast<uint64_t>(&r - requests.data());
  }

  const double load_at_start = LoadAverage();
  nlohmann::json runs = nlohmann::json::array();
  std::vector<std::vector<int32_t>> reference;
  double plain_tps[2] = {0, 0};
  double plain_cpu[2] = {0, 0};
  EngineRequest warmup = requests[0];
  for (auto& t : warmup.prompt) t = (t * 7 + 1) % 4000 + 3;
  warmup.max_tokens = 8;
  struct Config {
    std::string source;
    int branching;  // 1 = chains
  };
  std::vector<Config> configs = {{"none", 1}};
  for (const char* source : {"ngram", "suffix", "model"}) {
    configs.push_back({source, 1});
    if (absl::GetFlag(FLAGS_tree_branching) > 1) {
      configs.push_back({source, absl::GetFlag(FLAGS_tree_branching)});
    }
  }
  for (const Config& config : configs) {
    const std::string& s = config.source;
    tessera::spec::TreeOptions tree;
    tree.max_branching = config.branching;
    tree.branch_depth = absl::GetFlag(FLAGS_tree_depth);
    int idx = 0;
    for (int batch : {1, absl::GetFlag(FLAGS_batch)}) {
      // A fresh engine (and source: the suffix source remembers finished
      // requests) per repeat; the best of the repeats counts.
      RunResult best;
      best.seconds = 1e30;
      double min_cpu = 1e30;  // the least CPU time of the repeats
      Counter best_counter;
      for (int repeat = 0; repeat < absl::GetFlag(FLAGS_repeats); ++repeat) {
        tessera::engine::LocalEngineOptions lo;
        lo.model_dir = target;
        lo.device = absl::GetFlag(FLAGS_device);
        lo.kv_cache_memory_mb = 512;
        lo.max_num_seqs = 64;
        lo.enable_prefix_caching = false;
        if (s != "none") {
          lo.speculation.num_speculative_tokens = absl::GetFlag(FLAGS_k);
          if (s == "ngram") {
            tessera::spec::NgramOptions no;
            no.tree = tree;
            lo.draft_provider = std::make_shared<tessera::spec::LocalDraftProvider>(
                tessera::spec::MakeNgramSource(no));
          } else if (s == "suffix") {
            tessera::spec::SuffixOptions so;
            so.tree = tree;
            lo.draft_provider = std::make_shared<tessera::spec::LocalDraftProvider>(
                tessera::spec::MakeSuffixSource(so));
          } else {
            tessera::spec::ModelSourceFromDirOptions dopt;
            dopt.device = absl::GetFlag(FLAGS_draft_device);
            dopt.source.tree = tree;
            auto src = tessera::spec::MakeModelSourceFromDir(draft, dopt);
            if (!src.ok()) {
              std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
              return 1;
            }
            lo.draft_provider =
                std::make_shared<tessera::spec::LocalDraftProvider>(std::move(*src));
          }
        }
        Counter counter;
        auto local = tessera::engine::BuildLocalEngine(lo, &counter);
        if (!local.ok()) {
          std::fprintf(stderr, "%s\n", local.status().ToString().c_str());
          return 1;
        }
        tessera::engine::Engine& engine = *(*local)->engine;
        engine.Start();
        Run(engine, {warmup}, 1);
        counter = Counter();
        RunResult r = Run(engine, requests, batch);
        min_cpu = std::min(min_cpu, r.cpu_seconds);
        if (r.seconds < best.seconds) {
          best = std::move(r);
          best_counter = counter;
        }
      }
      const double tps = requests.size() * requests[0].max_tokens / best.seconds;
      if (s == "none") {
        plain_tps[idx] = tps;
        plain_cpu[idx] = min_cpu;
        if (batch == 1) reference = best.outputs;
      }
      nlohmann::json run = {
          {"source", s},
          {"drafts_shape", config.branching > 1 ? "tree" : "chain"},
          {"tree_branching", config.branching},
          {"batch", batch},
          {"seconds", best.seconds},
          {"output_tokens_per_second", tps},
          {"speedup_vs_plain", tps / plain_tps[idx]},
          {"cpu_seconds", min_cpu},
          {"cpu_time_speedup_vs_plain", plain_cpu[idx] / min_cpu},
          {"outputs_identical_to_plain", absl::GetFlag(FLAGS_temperature) > 0
                                             ? nlohmann::json(nullptr)
                                             : nlohmann::json(best.outputs == reference)},
      };
      const Counter& c = best_counter;
      if (s != "none") {
        run["drafts"] = c.drafts;
        run["draft_tokens"] = c.draft_tokens;
        run["accepted_tokens"] = c.accepted_tokens;
        run["acceptance_rate"] = c.draft_tokens ? double(c.accepted_tokens) / c.draft_tokens : 0.0;
        // Tokens per verification step: the accepted drafts plus the target's token.
        run["mean_acceptance_length"] = c.drafts ? 1.0 + double(c.accepted_tokens) / c.drafts : 1.0;
      }
      std::printf("%s\n", run.dump().c_str());
      std::fflush(stdout);
      runs.push_back(run);
      ++idx;
    }
  }
  nlohmann::json result = {
      {"what", "speculative decoding vs plain decoding, CPU engine in-process, greedy"},
      {"models", models},
      {"prompts", prompts_from},
      {"requests", requests.size()},
      {"prompt_tokens", absl::GetFlag(FLAGS_prompt)},
      {"generated_tokens", absl::GetFlag(FLAGS_generate)},
      {"max_draft_tokens", absl::GetFlag(FLAGS_k)},
      {"adaptive", true},
      {"tree_branching", absl::GetFlag(FLAGS_tree_branching)},
      {"tree_depth", absl::GetFlag(FLAGS_tree_depth)},
      {"repeats_best_of", absl::GetFlag(FLAGS_repeats)},
      {"device", absl::GetFlag(FLAGS_device)},
      {"draft_device", absl::GetFlag(FLAGS_draft_device)},
      {"temperature", absl::GetFlag(FLAGS_temperature)},
      {"machine_note",
       "shared 2-core machine; other jobs ran at the same time, so absolute "
       "speeds vary run to run"},
      {"load_average_1min_at_start", load_at_start},
      {"load_average_1min_at_end", LoadAverage()},
      {"runs", runs},
  };
  tessera::bench::WriteResult(absl::GetFlag(FLAGS_out), argc, argv, result);
  return 0;
}
