// engine_step_bench: the engine loop's own host time per step — schedule,
// build the forward batch, take the drawn tokens, complete the step, stream
// the tokens, publish the load — with a runner that costs nothing (it draws
// a fixed function of each row's position on its "device" and returns at
// once), so every microsecond measured is the engine's. This is the time a
// GPU waits for the host between steps when the loop is synchronous.
//
// Per batch size B: B requests of --prompt_len tokens, --output_len tokens
// each (ignore_eos), submitted at once, each read by its own thread (as the
// gRPC handlers do); reported: steps, wall time, host microseconds per step
// (wall / steps) and per sequence-step. --pipelined also runs the runner as
// an asynchronous one (submit/collect), where the host time per step is
// what the engine would hide behind a real device's step.
//
// --runner=cuda (GPU machine) runs the engine on a real CudaModelRunner
// instead: Llama-3-8B shapes with random bf16 weights on --device, decode
// graphs on unless --cuda_graphs=false, each batch size with pipelined
// steps off and on (EngineOptions::pipeline_steps; the runner's
// SubmitSample / CollectSample). Then the time per step is the device's
// plus whatever host time the loop does not hide, and the pipelined run's
// host_us_per_step should be lower by about the zero-cost runner's figure.
//
// Usage: engine_step_bench [--runner=zero|cuda] [--device=cuda[:<bus id>]]
//        [--batch_sizes=1,8,64] [--prompt_len=128] [--output_len=256]
//        [--budget=256] [--out=FILE]
#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "tests/bench/bench_util.h"
#if TESSERA_HAVE_CUDA
#include "kernels/cuda_devices.h"
#include "kernels/registry.h"
#include "tests/bench/llama3_8b_config.h"
#include "tests/bench/random_cuda_weights.h"
#include "worker/model/config.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#endif
#include "worker/engine/engine.h"
#include "worker/runner/simulated_model_runner.h"

ABSL_FLAG(std::vector<std::string>, batch_sizes, std::vector<std::string>({"1", "8", "64"}),
          "concurrent requests");
ABSL_FLAG(int, prompt_len, 128, "prompt tokens per request");
ABSL_FLAG(int, output_len, 256, "output tokens per request");
ABSL_FLAG(int, budget, 256, "max_num_batched_tokens");
ABSL_FLAG(int, vocab, 128256, "vocabulary (Llama 3's)");
ABSL_FLAG(std::string, out, "", "result JSON");
ABSL_FLAG(std::string, runner, "zero",
          "zero (a runner that costs nothing: the host's time alone) or cuda (a real "
          "CudaModelRunner of Llama-3-8B shapes, random weights; GPU builds)");
ABSL_FLAG(std::string, device, "cuda", "--runner=cuda: cuda or cuda:<PCI bus id>");
ABSL_FLAG(bool, cuda_graphs, true, "--runner=cuda: decode steps as CUDA graphs");

namespace tessera {
namespace {

// A runner whose steps cost nothing: tokens drawn "on the device" as a
// function of the row's position, steps synchronous or asynchronous.
class ZeroCostRunner final : public runner::ModelRunner {
 public:
  ZeroCostRunner(int64_t vocab, int64_t num_blocks, bool async)
      : config_(runner::SimulatedModelRunner::SyntheticConfig(vocab, 8192)),
        num_blocks_(num_blocks),
        async_(async) {}
  const model::ModelConfig& config() const override { return config_; }
  int block_size() const override { return 16; }
  int64_t num_kv_blocks() const override { return num_blocks_; }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override {
    logits->assign(batch.logits_indices.size() * static_cast<size_t>(config_.vocab_size), 0.0f);
    return absl::OkStatus();
  }
  bool SupportsDeviceSampling() const override { return true; }
  bool SupportsAsyncSampling() const override { return async_; }
  absl::Status ForwardSample(const runner::ForwardBatch& batch,
                             absl::Span<const runner::DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override {
    Draw(rows, tokens);
    return absl::OkStatus();
  }
  absl::Status SubmitSample(const runner::ForwardBatch& batch,
                            absl::Span<const runner::DeviceSamplingRow> rows,
                            absl::Span<const runner::PreviousStepToken>) override {
    queued_.emplace_back();
    Draw(rows, &queued_.back());
    return absl::OkStatus();
  }
  absl::Status CollectSample(std::vector<int32_t>* tokens) override {
    *tokens = std::move(queued_.front());
    queued_.pop_front();
    return absl::OkStatus();
  }

 private:
  void Draw(absl::Span<const runner::DeviceSamplingRow> rows, std::vector<int32_t>* tokens) const {
    tokens->clear();
    for (const runner::DeviceSamplingRow& r : rows) {
      tokens->push_back(static_cast<int32_t>(3 + r.position % (config_.vocab_size - 3)));
    }
  }
  model::ModelConfig config_;
  int64_t num_blocks_;
  bool async_;
  std::deque<std::vector<int32_t>> queued_;
};

class StepCounter : public engine::EngineObserver {
 public:
  void OnStep(const engine::ScheduledBatch&, absl::Duration) override { ++steps; }
  int64_t steps = 0;
};

// The runner of one run: --runner's kind, with `blocks` KV blocks of 16.
absl::StatusOr<std::unique_ptr<runner::ModelRunner>> MakeRunner(int batch, int64_t blocks,
                                                                bool pipelined) {
  const std::string kind = absl::GetFlag(FLAGS_runner);
  if (kind == "zero") {
    return std::make_unique<ZeroCostRunner>(absl::GetFlag(FLAGS_vocab), blocks, pipelined);
  }
  if (kind != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--runner must be zero or cuda, not ", kind));
  }
#if TESSERA_HAVE_CUDA
  absl::StatusOr<model::ModelConfig> config =
      model::ParseModelConfig(kLlama3_8BConfig, "llama3_8b");
  if (!config.ok()) return config.status();
  absl::StatusOr<kernels::DeviceDescription> device =
      kernels::ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  absl::StatusOr<kernels::Selection> prefill =
      kernels::BuiltinRegistry().Select(kernels::Op::kAttentionPrefill, *device);
  if (!prefill.ok()) return prefill.status();
  runner::CudaRunnerOptions options;
  options.block_size = 16;
  options.num_kv_blocks = blocks;
  options.max_num_seqs = batch;
  options.max_num_tokens = std::max(absl::GetFlag(FLAGS_budget), batch);
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.prefill_attention_backend = prefill->chosen;
  absl::StatusOr<std::unique_ptr<runner::CudaModelRunner>> r =
      runner::CudaModelRunner::Create(*config, bench::RandomCudaWeights(1234), *device, options);
  if (!r.ok()) return r.status();
  return std::unique_ptr<runner::ModelRunner>(std::move(*r));
#else
  return absl::FailedPreconditionError("--runner=cuda needs a build with CUDA");
#endif
}

nlohmann::json RunBatch(int batch, bool pipelined) {
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len),
            output_len = absl::GetFlag(FLAGS_output_len);
  const int64_t blocks = int64_t{batch} * ((prompt_len + output_len) / 16 + 2) + 16;
  absl::StatusOr<std::unique_ptr<runner::ModelRunner>> model_runner =
      MakeRunner(batch, blocks, pipelined);
  if (!model_runner.ok()) {
    std::fprintf(stderr, "runner: %s\n", model_runner.status().ToString().c_str());
    std::exit(1);
  }
  const int vocab = static_cast<int>((*model_runner)->config().vocab_size);
  StepCounter counter;
  engine::EngineOptions eo;
  eo.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_budget);
  eo.scheduler.max_num_seqs = batch;
  eo.scheduler.max_model_len = 8192;
  eo.pipeline_steps = pipelined;
  auto engine = engine::Engine::Create(*std::move(model_runner), eo, &counter);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    for (int t = 0; t < prompt_len; ++t)
      r.prompt.push_back(3 + (i * 7919 + t * 104729) % std::min(100000, vocab - 3));
    r.max_tokens = output_len;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    streams.push_back(*(*engine)->Submit(std::move(r)));
  }
  const absl::Time start = absl::Now();
  (*engine)->Start();
  std::vector<std::thread> readers;
  std::vector<int> received(batch, 0);
  for (int i = 0; i < batch; ++i) {
    readers.emplace_back([&, i] {
      engine::StreamEvent e;
      while (streams[i]->Next(&e, absl::Seconds(60))) {
        received[i] += static_cast<int>(e.tokens.size());
        if (e.finished) break;
      }
    });
  }
  for (std::thread& t : readers) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  (*engine)->Stop();
  int64_t tokens = 0;
  for (int n : received) tokens += n;
  const double us_per_step = 1e6 * seconds / static_cast<double>(counter.steps);
  return {{"batch", batch},
          {"runner", absl::GetFlag(FLAGS_runner)},
          {"pipelined", pipelined},
          {"output_tok_per_s", static_cast<double>(tokens) / seconds},
          {"steps", counter.steps},
          {"seconds", seconds},
          {"output_tokens", tokens},
          {"host_us_per_step", us_per_step},
          {"host_us_per_sequence_step", us_per_step / batch}};
}

int Run(int argc, char** argv) {
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& b : absl::GetFlag(FLAGS_batch_sizes)) {
    for (bool pipelined : {false, true}) {
      results.push_back(RunBatch(std::stoi(b), pipelined));
      std::fprintf(stderr, "%s\n", results.back().dump().c_str());
    }
  }
  const bool zero = absl::GetFlag(FLAGS_runner) == "zero";
  nlohmann::json out = {
      {"benchmark", zero ? "engine_step_bench: the engine loop's host time per step, with a "
                           "runner that costs nothing"
                         : "engine_step_bench: the engine on the CUDA runner (Llama-3-8B "
                           "shapes, random bf16 weights), pipelined steps off and on"},
      {"cuda_graphs", absl::GetFlag(FLAGS_cuda_graphs)},
      {"prompt_len", absl::GetFlag(FLAGS_prompt_len)},
      {"output_len", absl::GetFlag(FLAGS_output_len)},
      {"max_num_batched_tokens", absl::GetFlag(FLAGS_budget)},
      {"vocab", absl::GetFlag(FLAGS_vocab)},
      {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  bench::WriteResult(absl::GetFlag(FLAGS_out), argc, argv, out);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run(argc, argv);
}
