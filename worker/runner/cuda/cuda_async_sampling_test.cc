// The CUDA runner's asynchronous steps (SubmitSample / CollectSample) on a
// real GPU (skipped without one):
// - a multi-step run of three sequences (greedy and one seeded sampled
//   row), where each step after the first is submitted before the one
//   before it is collected and takes its decode tokens from that step's
//   draws on the device (PreviousStepToken), gives exactly the tokens of
//   the same steps run synchronously with ForwardSample, eagerly and with
//   decode graphs (a sequence joining mid-run makes some steps eager in
//   both); exact, since the same kernels run on the same inputs;
// - the protocol: a third submission while two are in flight, ForwardSample
//   with steps in flight, a collect with none, previous-step tokens out of
//   range or with no previous submitted step are refused with a clear
//   status and queue nothing, and the runner keeps working;
// - the engine on the CUDA runner with pipelined steps produces what it
//   produces with them off, graphs on and off (and did chain steps).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/model/weights.h"
#include "worker/runner/cuda/cuda_model_runner.h"
#include "worker/runner/cuda/cuda_runner_test_util.h"

namespace tessera::runner {
namespace {

std::string SourcePath(const std::string& rel) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/", rel);
}

CudaRunnerOptions AsyncTestOptions(bool graphs) {
  CudaRunnerOptions options = TestOptions(64, 256, 8);
  options.cuda_graphs = graphs;
  // Timed GEMM tuning may pick other algorithms in another runner, and so
  // other last bits: the heuristic's choice is the same for both.
  options.gemm_autotune = false;
  return options;
}

// One sequence of the scripted run: its blocks, its prompt, the step it
// joins at, and its sampling.
struct Script {
  std::vector<int32_t> table;
  std::vector<int32_t> prompt;
  int joins_at = 0;
  DeviceSamplingRow sampling;
};

std::vector<Script> ThreeSequences() {
  DeviceSamplingRow greedy;
  greedy.temperature = 0.0f;
  DeviceSamplingRow sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  sampled.seed = 7;
  return {{{0, 1, 2, 3}, {5, 6, 7, 8, 9, 10, 11}, 0, greedy},
          {{8, 9, 10, 11}, {100, 200, 300}, 0, sampled},
          {{16, 17, 18, 19}, {42, 43, 44, 45, 46, 47, 48, 49, 50}, 3, greedy}};
}

// Step `step` of the script: a sequence prefills its prompt on the step it
// joins and decodes one token a step after; `last[s]` is the token it drew
// on the step before (kUnknown: only the device knows it yet, so the batch
// gets a placeholder and a PreviousStepToken entry for its row there).
constexpr int32_t kUnknown = -1;
struct ScriptStep {
  ForwardBatch batch;
  std::vector<DeviceSamplingRow> rows;
  std::vector<PreviousStepToken> from_previous;
  std::vector<int> seq_of_row;
};
ScriptStep BuildStep(const std::vector<Script>& script, int step, const std::vector<int32_t>& last,
                     const std::vector<int32_t>& prev_row, std::vector<int32_t>* len) {
  ScriptStep out;
  out.batch.block_table_stride = 4;
  for (size_t s = 0; s < script.size(); ++s) {
    if (step < script[s].joins_at) continue;
    std::vector<int32_t> tokens;
    if (step == script[s].joins_at) {
      tokens = script[s].prompt;
    } else if (last[s] == kUnknown) {
      out.from_previous.push_back({out.batch.num_tokens(), prev_row[s]});
      tokens = {0};  // placeholder: the runner takes the drawn id
    } else {
      tokens = {last[s]};
    }
    out.batch.AddSequence(tokens, (*len)[s], script[s].table, 16, true);
    (*len)[s] += static_cast<int32_t>(tokens.size());
    DeviceSamplingRow row = script[s].sampling;
    row.position = (*len)[s];
    out.rows.push_back(row);
    out.seq_of_row.push_back(static_cast<int>(s));
  }
  return out;
}

constexpr int kSteps = 12;

// Every step synchronous: ForwardSample, its tokens fed to the next step.
std::vector<std::vector<int32_t>> RunSynchronously(CudaModelRunner& runner) {
  const std::vector<Script> script = ThreeSequences();
  std::vector<int32_t> last(script.size(), kUnknown), prev_row(script.size(), -1),
      len(script.size(), 0);
  std::vector<std::vector<int32_t>> drawn(script.size());
  for (int step = 0; step < kSteps; ++step) {
    ScriptStep st = BuildStep(script, step, last, prev_row, &len);
    EXPECT_TRUE(st.from_previous.empty());
    std::vector<int32_t> tokens;
    const absl::Status s = runner.ForwardSample(st.batch, st.rows, &tokens);
    EXPECT_TRUE(s.ok()) << "step " << step << ": " << s;
    if (!s.ok()) return drawn;
    for (size_t r = 0; r < tokens.size(); ++r) {
      last[st.seq_of_row[r]] = tokens[r];
      drawn[st.seq_of_row[r]].push_back(tokens[r]);
    }
  }
  return drawn;
}

// Pipelined as the engine does it: submit step k+1 (its decode tokens from
// step k's draws on the device), then collect step k.
std::vector<std::vector<int32_t>> RunPipelined(CudaModelRunner& runner) {
  const std::vector<Script> script = ThreeSequences();
  std::vector<int32_t> last(script.size(), kUnknown), prev_row(script.size(), -1),
      len(script.size(), 0);
  std::vector<std::vector<int32_t>> drawn(script.size());
  std::vector<int> pending_seq_of_row;
  int previous_step_entries = 0;
  for (int step = 0; step <= kSteps; ++step) {
    std::vector<int> seq_of_row;
    if (step < kSteps) {
      ScriptStep st = BuildStep(script, step, last, prev_row, &len);
      if (step > 0) {
        EXPECT_FALSE(st.from_previous.empty()) << "step " << step;
      }
      previous_step_entries += static_cast<int>(st.from_previous.size());
      const absl::Status s = runner.SubmitSample(st.batch, st.rows, st.from_previous);
      EXPECT_TRUE(s.ok()) << "submit " << step << ": " << s;
      if (!s.ok()) return drawn;
      EXPECT_EQ(runner.steps_in_flight(), step == 0 ? 1 : 2);
      seq_of_row = st.seq_of_row;
      // This step's rows are the next step's previous rows; the host does
      // not know its tokens yet.
      std::fill(last.begin(), last.end(), kUnknown);
      for (size_t r = 0; r < seq_of_row.size(); ++r) prev_row[seq_of_row[r]] = static_cast<int>(r);
    }
    if (step > 0) {
      std::vector<int32_t> tokens;
      const absl::Status s = runner.CollectSample(&tokens);
      EXPECT_TRUE(s.ok()) << "collect " << step - 1 << ": " << s;
      if (!s.ok()) return drawn;
      EXPECT_EQ(tokens.size(), pending_seq_of_row.size());
      for (size_t r = 0; r < tokens.size() && r < pending_seq_of_row.size(); ++r) {
        drawn[pending_seq_of_row[r]].push_back(tokens[r]);
      }
    }
    pending_seq_of_row = seq_of_row;
  }
  EXPECT_GT(previous_step_entries, 20);
  EXPECT_EQ(runner.steps_in_flight(), 0);
  return drawn;
}

TEST(CudaAsyncSamplingTest, PipelinedStepsDrawWhatSynchronousStepsDraw) {
  REQUIRE_GPU(device);
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    auto sync = CudaModelRunner::Create(model->get(), device, AsyncTestOptions(graphs));
    ASSERT_TRUE(sync.ok()) << sync.status();
    auto async = CudaModelRunner::Create(model->get(), device, AsyncTestOptions(graphs));
    ASSERT_TRUE(async.ok()) << async.status();
    EXPECT_TRUE((*async)->SupportsAsyncSampling());
    const std::vector<std::vector<int32_t>> want = RunSynchronously(**sync);
    const std::vector<std::vector<int32_t>> got = RunPipelined(**async);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      EXPECT_EQ(want[s].size(), s == 2 ? size_t{kSteps - 3} : size_t{kSteps}) << "sequence " << s;
      EXPECT_EQ(got[s], want[s]) << "sequence " << s;
    }
    if (graphs) {
      EXPECT_GE((*async)->graphs_captured(), 1);
      EXPECT_EQ((*async)->graphs_captured(), (*sync)->graphs_captured());
    } else {
      EXPECT_EQ((*async)->graphs_captured(), 0);
    }
  }
}

TEST(CudaAsyncSamplingTest, ProtocolMisuseIsRefusedAndQueuesNothing) {
  REQUIRE_GPU(device);
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto gpu = CudaModelRunner::Create(model->get(), device, AsyncTestOptions(true));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CudaModelRunner& r = **gpu;
  ForwardBatch prefill;
  prefill.block_table_stride = 4;
  prefill.AddSequence({5, 6, 7, 8}, 0, {0, 1, 2, 3}, 16, true);
  DeviceSamplingRow greedy;
  greedy.temperature = 0.0f;
  auto decode = [](int32_t token, int32_t position) {
    ForwardBatch b;
    b.block_table_stride = 4;
    b.AddSequence({token}, position, {0, 1, 2, 3}, 16, true);
    return b;
  };
  std::vector<int32_t> tokens;
  EXPECT_EQ(r.CollectSample(&tokens).code(), absl::StatusCode::kFailedPrecondition);
  // No step submitted before: nothing to take tokens from.
  absl::Status s = r.SubmitSample(prefill, {greedy}, {{0, 0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(r.steps_in_flight(), 0);
  // The synchronous reference: prefill, then three decode steps.
  std::vector<int32_t> want;
  ASSERT_TRUE(r.ForwardSample(prefill, {greedy}, &tokens).ok());
  want.push_back(tokens[0]);
  for (int32_t p = 4; p < 7; ++p) {
    ASSERT_TRUE(r.ForwardSample(decode(want.back(), p), {greedy}, &tokens).ok());
    want.push_back(tokens[0]);
  }
  // Again asynchronously: two in flight is the limit.
  ASSERT_TRUE(r.SubmitSample(prefill, {greedy}, {}).ok());
  ASSERT_TRUE(r.SubmitSample(decode(0, 4), {greedy}, {{0, 0}}).ok());
  s = r.SubmitSample(decode(0, 5), {greedy}, {{0, 0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "not collected")) << s;
  EXPECT_EQ(r.steps_in_flight(), 2);
  s = r.ForwardSample(decode(1, 5), {greedy}, &tokens);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(r.steps_in_flight(), 2);
  std::vector<int32_t> got;
  ASSERT_TRUE(r.CollectSample(&tokens).ok());
  got.push_back(tokens.at(0));
  // Bad entries are refused before the device sees them: a row past the
  // previous step's, a token past the batch's, rows that do not match.
  EXPECT_EQ(r.SubmitSample(decode(0, 5), {greedy}, {{0, 1}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.SubmitSample(decode(0, 5), {greedy}, {{1, 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.SubmitSample(decode(0, 5), {greedy, greedy}, {{0, 0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.SubmitSample(decode(1 << 30, 5), {greedy}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.steps_in_flight(), 1);
  // ...and the previous step's draws are still there to take.
  ASSERT_TRUE(r.SubmitSample(decode(0, 5), {greedy}, {{0, 0}}).ok());
  ASSERT_TRUE(r.CollectSample(&tokens).ok());
  got.push_back(tokens.at(0));
  ASSERT_TRUE(r.SubmitSample(decode(0, 6), {greedy}, {{0, 0}}).ok());
  ASSERT_TRUE(r.CollectSample(&tokens).ok());
  got.push_back(tokens.at(0));
  ASSERT_TRUE(r.CollectSample(&tokens).ok());
  got.push_back(tokens.at(0));
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.CollectSample(&tokens).code(), absl::StatusCode::kFailedPrecondition);
  // A synchronous Forward replaces the device's draws: no previous step.
  std::vector<float> logits;
  ASSERT_TRUE(r.Forward(decode(want.back(), 7), &logits).ok());
  s = r.SubmitSample(decode(0, 8), {greedy}, {{0, 0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(r.steps_in_flight(), 0);
}

// The CUDA runner as the engine sees it, counting the submissions that took
// tokens from the step before (so a run that never pipelined cannot pass
// for one that did).
class CountingRunner final : public ModelRunner {
 public:
  CountingRunner(std::unique_ptr<CudaModelRunner> base, std::shared_ptr<std::atomic<int>> chained)
      : base_(std::move(base)), chained_(std::move(chained)) {}
  const model::ModelConfig& config() const override { return base_->config(); }
  int block_size() const override { return base_->block_size(); }
  int64_t num_kv_blocks() const override { return base_->num_kv_blocks(); }
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override {
    return base_->Forward(batch, logits);
  }
  bool SupportsTreeAttention() const override { return base_->SupportsTreeAttention(); }
  absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) override {
    return base_->CopyKvSlots(from, to);
  }
  bool SupportsDeviceSampling() const override { return base_->SupportsDeviceSampling(); }
  absl::Status ForwardSample(const ForwardBatch& batch, absl::Span<const DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override {
    return base_->ForwardSample(batch, rows, tokens);
  }
  bool SupportsAsyncSampling() const override { return base_->SupportsAsyncSampling(); }
  absl::Status SubmitSample(const ForwardBatch& batch, absl::Span<const DeviceSamplingRow> rows,
                            absl::Span<const PreviousStepToken> from_previous) override {
    const absl::Status s = base_->SubmitSample(batch, rows, from_previous);
    if (s.ok() && !from_previous.empty()) ++*chained_;
    return s;
  }
  absl::Status CollectSample(std::vector<int32_t>* tokens) override {
    return base_->CollectSample(tokens);
  }
  absl::Status Health() const override { return base_->Health(); }

 private:
  std::unique_ptr<CudaModelRunner> base_;
  std::shared_ptr<std::atomic<int>> chained_;
};

std::vector<std::vector<int32_t>> DrainStreams(
    const std::vector<std::shared_ptr<engine::RequestStream>>& streams) {
  std::vector<std::vector<int32_t>> out(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    engine::StreamEvent e;
    while (streams[i]->Next(&e, absl::Seconds(60))) {
      EXPECT_TRUE(e.error.ok()) << e.error;
      for (const engine::TokenReport& t : e.tokens) out[i].push_back(t.token);
      if (e.finished) break;
    }
  }
  return out;
}

// Greedy and seeded sampled requests, all queued before the loop starts so
// that both runs schedule the same batches (the kernels are not
// batch-invariant).
TEST(CudaAsyncSamplingTest, EngineWithPipelinedStepsEqualsTheSynchronousLoop) {
  REQUIRE_GPU(device);
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto generate = [&](bool pipelined, bool graphs) {
    CudaRunnerOptions options;
    options.num_kv_blocks = 128;
    options.max_num_tokens = 1024;
    options.max_num_seqs = 8;
    options.cuda_graphs = graphs;
    options.gemm_autotune = false;  // the same GEMM algorithms in every runner
    auto runner = CudaModelRunner::Create(model->get(), device, options);
    EXPECT_TRUE(runner.ok()) << runner.status();
    EXPECT_TRUE((*runner)->SupportsAsyncSampling());
    auto chained = std::make_shared<std::atomic<int>>(0);
    engine::EngineOptions eo;
    eo.scheduler.max_num_seqs = 8;
    eo.scheduler.max_num_batched_tokens = 64;  // prompts span steps with decodes
    eo.scheduler.max_model_len = 2048;
    eo.pipeline_steps = pipelined;
    auto engine =
        engine::Engine::Create(std::make_unique<CountingRunner>(*std::move(runner), chained), eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (int i = 0; i < 6; ++i) {
      engine::EngineRequest r;
      r.request_id = absl::StrCat("r", i);
      for (int j = 0; j < 20 + 7 * i; ++j) r.prompt.push_back((37 * i + 11 * j) % 4000 + 3);
      r.max_tokens = 24 + 2 * i;
      r.ignore_eos = true;
      r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.7f + 0.1f * i;
      r.sampling.top_k = i % 3 == 1 ? 40 : 0;
      r.sampling.seed = 100 + i;
      auto stream = (*engine)->Submit(r);
      EXPECT_TRUE(stream.ok()) << stream.status();
      streams.push_back(*stream);
    }
    (*engine)->Start();
    const std::vector<std::vector<int32_t>> out = DrainStreams(streams);
    (*engine)->Stop();
    // Pipelined: most steps take their decode tokens from the step before.
    if (pipelined) {
      EXPECT_GT(chained->load(), 20);
    } else {
      EXPECT_EQ(chained->load(), 0);
    }
    return out;
  };
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    const std::vector<std::vector<int32_t>> pipelined = generate(true, graphs);
    const std::vector<std::vector<int32_t>> synchronous = generate(false, graphs);
    ASSERT_EQ(pipelined.size(), synchronous.size());
    for (size_t i = 0; i < pipelined.size(); ++i) {
      EXPECT_EQ(pipelined[i].size(), 24u + 2 * i) << "request " << i;
      EXPECT_EQ(pipelined[i], synchronous[i]) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace tessera::runner
