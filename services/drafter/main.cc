// tessera-drafter: proposes speculative tokens to workers (tessera.v1.Drafter).
//
// --draft_source picks the source: ngram (prompt lookup), suffix (suffix
// automaton over each sequence and recent outputs) or model (a small model
// of the target's tokenizer, --model, run on the CPU kernels with a KV cache
// per worker stream). --draft_tree_branching > 1 makes the proposals token
// trees (worker/spec/README.md).
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/drafter/drafter_service.h"
#include "worker/model/weights.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/spec/model_source.h"

ABSL_FLAG(std::string, draft_source, "ngram", "Draft source: ngram, suffix or model");
ABSL_FLAG(std::string, model, "", "Draft model directory (for --draft_source=model)");
ABSL_FLAG(int, max_draft_tokens, 16, "Most tokens per proposal, whatever a worker asks");
ABSL_FLAG(int, draft_kv_cache_blocks, 2048, "KV blocks of the draft model, per worker stream");
ABSL_FLAG(int, draft_block_size, 16, "Tokens per KV block of the draft model");
ABSL_FLAG(int, draft_max_model_len, 0, "Context length of the draft model; 0 = the model's");
ABSL_FLAG(int, cpu_threads, 0, "Threads for the draft model's CPU kernels; 0 = all cores");
ABSL_FLAG(int, draft_tree_branching, 1,
          "Token trees: most candidates per position (1 = chains). ngram/suffix branch where "
          "earlier occurrences continue differently; model adds its runner-up tokens as siblings");
ABSL_FLAG(int, draft_tree_depth, 1,
          "With --draft_source=model and trees: positions (from the first) that get siblings");
ABSL_FLAG(int, inject_delay_ms, 0,
          "Testing: delay every batch of proposals by this long (a slow drafter)");

namespace ts = tessera::services;

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv,
                        "tessera-drafter: speculative token proposals (tessera.v1.Drafter)");
  tessera::SetLogService("drafter");

  const std::string kind = absl::GetFlag(FLAGS_draft_source);
  tessera::spec::TreeOptions tree;
  tree.max_branching = absl::GetFlag(FLAGS_draft_tree_branching);
  tree.branch_depth = absl::GetFlag(FLAGS_draft_tree_depth);
  if (tree.max_branching < 1 || tree.max_branching > 16 || tree.branch_depth < 1) {
    return ts::StartupError(absl::InvalidArgumentError(
        "--draft_tree_branching must be in [1, 16] and --draft_tree_depth >= 1"));
  }
  ts::DrafterService::SourceFactory factory;
  std::unique_ptr<tessera::model::LoadedModel> model;
  if (kind == "ngram") {
    tessera::spec::NgramOptions no;
    no.tree = tree;
    factory = [no] { return tessera::spec::MakeNgramSource(no); };
  } else if (kind == "suffix") {
    tessera::spec::SuffixOptions so;
    so.tree = tree;
    factory = [so] { return tessera::spec::MakeSuffixSource(so); };
  } else if (kind == "model") {
    if (absl::GetFlag(FLAGS_model).empty()) {
      return ts::StartupError(
          absl::InvalidArgumentError("--draft_source=model needs --model DIR (the draft model)"));
    }
    auto loaded = tessera::model::LoadModel(absl::GetFlag(FLAGS_model));
    if (!loaded.ok()) return ts::StartupError(loaded.status());
    model = std::move(*loaded);
    tessera::runner::CpuRunnerOptions ro;
    ro.block_size = absl::GetFlag(FLAGS_draft_block_size);
    ro.num_kv_blocks = absl::GetFlag(FLAGS_draft_kv_cache_blocks);
    ro.num_threads = absl::GetFlag(FLAGS_cpu_threads);
    tessera::spec::ModelSourceOptions so;
    so.max_model_len = absl::GetFlag(FLAGS_draft_max_model_len) > 0
                           ? absl::GetFlag(FLAGS_draft_max_model_len)
                           : static_cast<int>(model->config.max_position_embeddings);
    so.tree = tree;
    // Check once at start-up that a runner can be built.
    if (auto probe = tessera::runner::CpuModelRunner::Create(model.get(), ro); !probe.ok()) {
      return ts::StartupError(probe.status());
    }
    const tessera::model::LoadedModel* m = model.get();
    factory = [m, ro, so]() -> absl::StatusOr<std::unique_ptr<tessera::spec::DraftSource>> {
      auto runner = tessera::runner::CpuModelRunner::Create(m, ro);
      if (!runner.ok()) return runner.status();
      return tessera::spec::MakeModelSource(std::move(*runner), so);
    };
  } else {
    return ts::StartupError(absl::InvalidArgumentError(
        absl::StrCat("--draft_source=", kind, ": expected ngram, suffix or model")));
  }
  if (absl::GetFlag(FLAGS_max_draft_tokens) < 1 || absl::GetFlag(FLAGS_inject_delay_ms) < 0) {
    return ts::StartupError(
        absl::InvalidArgumentError("--max_draft_tokens must be >= 1 and --inject_delay_ms >= 0"));
  }
  ts::DrafterServiceOptions options;
  options.max_draft_tokens = absl::GetFlag(FLAGS_max_draft_tokens);
  options.inject_delay = absl::Milliseconds(absl::GetFlag(FLAGS_inject_delay_ms));

  ts::ServiceHost host(ts::ServerOptionsFromFlags("drafter"));
  ts::DrafterService service(&host.drain(), factory, options);
  host.AddService(&service, "tessera.v1.Drafter");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);
  tessera::LogInfo("ready", {{"draft_source", kind}, {"tree_branching", tree.max_branching}});
  host.SetReady(true);
  return host.RunUntilShutdown();
}
