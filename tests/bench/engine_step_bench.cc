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
// Usage: engine_step_bench [--batch_sizes=1,8,64] [--prompt_len=128]
//        [--output_len=256] [--budget=256] [--out=FILE]
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
#include "worker/engine/engine.h"
#include "worker/runner/simulated_model_runner.h"

ABSL_FLAG(std::vector<std::string>, batch_sizes, std::vector<std::string>({"1", "8", "64"}),
          "concurrent requests");
ABSL_FLAG(int, prompt_len, 128, "prompt tokens per request");
ABSL_FLAG(int, output_len, 256, "output tokens per request");
ABSL_FLAG(int, budget, 256, "max_num_batched_tokens");
ABSL_FLAG(int, vocab, 128256, "vocabulary (Llama 3's)");
ABSL_FLAG(std::string, out, "", "result JSON");

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

nlohmann::json RunBatch(int batch, bool pipelined) {
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len),
            output_len = absl::GetFlag(FLAGS_output_len);
  const int64_t blocks = int64_t{batch} * ((prompt_len + output_len) / 16 + 2) + 16;
  StepCounter counter;
  engine::EngineOptions eo;
  eo.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_budget);
  eo.scheduler.max_num_seqs = batch;
  eo.scheduler.max_model_len = 8192;
  eo.pipeline_steps = pipelined;
  auto engine = engine::Engine::Create(
      std::make_unique<ZeroCostRunner>(absl::GetFlag(FLAGS_vocab), blocks, pipelined), eo,
      &counter);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    for (int t = 0; t < prompt_len; ++t) r.prompt.push_back(3 + (i * 7919 + t * 104729) % 100000);
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
          {"pipelined", pipelined},
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
  nlohmann::json out = {{"benchmark",
                         "engine_step_bench: the engine loop's host time per step, with a runner "
                         "that costs nothing"},
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
