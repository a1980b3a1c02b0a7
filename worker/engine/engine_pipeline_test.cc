// The engine's pipelined steps (engine.h, README.md): with a runner whose
// steps are asynchronous, step N+1 is submitted before step N's tokens are
// collected, and the output is the synchronous engine's in every case —
// batching, chunked prefill, preemption, seeded sampling, a stop or a length
// limit reached at step N, cancellation while a step is pending, a failed
// step, and steps that need the host in between.
#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/async_test_runner.h"
#include "worker/engine/engine.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::engine {
namespace {

class EnginePipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = "/tmp/tessera-pipeline-XXXXXX";
    dir_ = new std::string(mkdtemp(pattern.data()));
    runner::TestModelSpec spec;
    spec.vocab = 512;
    spec.hidden = 64;
    spec.intermediate = 128;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 16;
    spec.dtype = model::DType::kBF16;
    ASSERT_TRUE(runner::WriteTestModel(*dir_, spec).ok());
    auto m = model::LoadModel(*dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }

  enum class Kind { kCpu, kAsync, kAsyncUnpipelined };

  // An engine over the CPU runner: plain (host sampling), or wrapped in the
  // asynchronous test runner, pipelined or not. `async` gets the wrapper.
  std::unique_ptr<Engine> MakeEngine(Kind kind, int num_blocks, int max_batched_tokens = 256,
                                     AsyncTestRunner** async = nullptr) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 16;
    ro.num_kv_blocks = num_blocks;
    auto cpu = runner::CpuModelRunner::Create(model_, ro);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    std::unique_ptr<runner::ModelRunner> r = std::move(*cpu);
    if (kind != Kind::kCpu) {
      auto wrapped = std::make_unique<AsyncTestRunner>(std::move(r));
      if (async != nullptr) *async = wrapped.get();
      r = std::move(wrapped);
    }
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = max_batched_tokens;
    eo.scheduler.max_num_seqs = 64;
    eo.scheduler.max_model_len = 1024;
    eo.scheduler.watermark = 0;
    eo.eos_token_ids = {2};
    eo.pipeline_steps = kind == Kind::kAsync;
    auto e = Engine::Create(std::move(r), eo);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  static EngineRequest Request(std::vector<TokenId> prompt, int max_tokens, float temperature = 0,
                               uint64_t seed = 0) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.ignore_eos = true;
    return r;
  }

  static std::vector<TokenId> RandomPrompt(int n, int seed) {
    std::mt19937 rng(seed);
    std::vector<TokenId> p(n);
    for (auto& t : p) t = static_cast<TokenId>(3 + rng() % 500);
    return p;
  }

  // Reads a stream to its end; returns the tokens and the final event.
  static std::vector<TokenId> Collect(RequestStream& s, StreamEvent* final_event = nullptr) {
    std::vector<TokenId> tokens;
    StreamEvent e;
    while (true) {
      if (!s.Next(&e, absl::Seconds(120))) {
        ADD_FAILURE() << "stream timed out";
        return tokens;
      }
      for (const TokenReport& t : e.tokens) tokens.push_back(t.token);
      if (e.finished) break;
    }
    if (final_event) *final_event = e;
    return tokens;
  }

  // Runs `requests` on a started engine of `kind`, all submitted at once.
  std::vector<std::vector<TokenId>> RunAll(Kind kind, const std::vector<EngineRequest>& requests,
                                           int num_blocks, int max_batched_tokens,
                                           std::vector<StreamEvent>* finals = nullptr,
                                           int64_t* preemptions = nullptr) {
    auto engine = MakeEngine(kind, num_blocks, max_batched_tokens);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const EngineRequest& r : requests) {
      auto s = engine->Submit(r);
      EXPECT_TRUE(s.ok()) << s.status();
      streams.push_back(*s);
    }
    engine->Start();
    std::vector<std::vector<TokenId>> out;
    for (auto& s : streams) {
      StreamEvent last;
      out.push_back(Collect(*s, &last));
      EXPECT_TRUE(last.error.ok()) << last.error;
      if (finals) finals->push_back(last);
    }
    if (preemptions) *preemptions = engine->Load().preemptions;
    EXPECT_EQ(engine->Load().kv_blocks_used, 0);
    return out;
  }

  // Steps a not-started engine until it has nothing to do.
  static void StepUntilIdle(Engine& engine) {
    for (int i = 0; i < 10000 && engine.StepForTest(); ++i) {
    }
  }

  static std::string* dir_;
  static model::LoadedModel* model_;
};

std::string* EnginePipelineTest::dir_ = nullptr;
model::LoadedModel* EnginePipelineTest::model_ = nullptr;

TEST_F(EnginePipelineTest, SubmitsStepNPlusOneBeforeCollectingStepN) {
  AsyncTestRunner* runner = nullptr;
  auto engine = MakeEngine(Kind::kAsync, 64, 256, &runner);
  auto s = engine->Submit(Request(RandomPrompt(20, 1), 4));
  ASSERT_TRUE(s.ok());
  StreamEvent e;
  ASSERT_TRUE(engine->StepForTest());  // the prefill goes out
  EXPECT_THAT(runner->log(), ::testing::ElementsAre("submit 1"));
  EXPECT_FALSE((*s)->Next(&e, absl::ZeroDuration())) << "no token before its step is collected";
  ASSERT_TRUE(engine->StepForTest());  // the first decode goes out, then the prefill's token
  EXPECT_THAT(runner->log(), ::testing::ElementsAre("submit 1", "submit 2", "collect 1"));
  ASSERT_TRUE((*s)->Next(&e, absl::ZeroDuration()));
  EXPECT_EQ(e.tokens.size(), 1u);
  EXPECT_EQ(runner->in_flight(), 1);
  StepUntilIdle(*engine);
  // 4 tokens: the prefill and 3 decodes, each submitted before the one
  // before it is collected; the 4th token ends it by length, so no 5th
  // step is submitted.
  EXPECT_THAT(runner->log(),
              ::testing::ElementsAre("submit 1", "submit 2", "collect 1", "submit 3", "collect 2",
                                     "submit 4", "collect 3", "collect 4"));
  std::vector<TokenId> tokens = {e.tokens[0].token};
  StreamEvent last;
  for (TokenId t : Collect(**s, &last)) tokens.push_back(t);
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(last.output_tokens, 4);
  auto sync = RunAll(Kind::kCpu, {Request(RandomPrompt(20, 1), 4)}, 64, 256);
  EXPECT_EQ(tokens, sync[0]);
}

TEST_F(EnginePipelineTest, OutputsEqualTheSynchronousEngines) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 14; ++i) {
    // Greedy and seeded sampling; prompts long enough to be chunked.
    requests.push_back(Request(RandomPrompt(5 + (i * 37) % 110, i), 10 + (i * 7) % 20,
                               i % 2 == 0 ? 0.0f : 0.9f, 1000 + i));
  }
  const auto host = RunAll(Kind::kCpu, requests, 256, 256);
  const auto unpipelined = RunAll(Kind::kAsyncUnpipelined, requests, 256, 256);
  EXPECT_EQ(unpipelined, host);
  // Pipelined, on a cache small enough to preempt and a budget that chunks.
  int64_t preemptions = 0;
  const auto pipelined = RunAll(Kind::kAsync, requests, 20, 48, nullptr, &preemptions);
  EXPECT_EQ(pipelined, host);
  EXPECT_GT(preemptions, 0) << "the test meant to exercise preemption";
}

TEST_F(EnginePipelineTest, AStopAtStepNDoesNotEmitStepNPlusOnesToken) {
  const std::vector<TokenId> prompt = RandomPrompt(30, 7);
  const std::vector<TokenId> free_run = RunAll(Kind::kCpu, {Request(prompt, 12)}, 64, 256)[0];
  // A stop id first drawn at index k >= 2.
  size_t k = 2;
  while (k < free_run.size() &&
         std::find(free_run.begin(), free_run.begin() + k, free_run[k]) != free_run.begin() + k) {
    ++k;
  }
  ASSERT_LT(k, free_run.size());
  EngineRequest stop = Request(prompt, 12);
  stop.stop_token_ids = {free_run[k]};
  // And a length limit on a token that is a stop id too: kStop, as a plain
  // step decides.
  EngineRequest both = Request(prompt, static_cast<int>(k) + 1);
  both.stop_token_ids = {free_run[k]};
  EngineRequest length = Request(prompt, static_cast<int>(k) + 1);
  const std::vector<EngineRequest> requests = {stop, both, length};

  std::vector<StreamEvent> sync_finals, finals;
  const auto sync = RunAll(Kind::kCpu, requests, 64, 256, &sync_finals);
  AsyncTestRunner* runner = nullptr;
  auto engine = MakeEngine(Kind::kAsync, 64, 256, &runner);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
  StepUntilIdle(*engine);
  const std::vector<TokenId> want(free_run.begin(), free_run.begin() + k + 1);
  for (size_t i = 0; i < requests.size(); ++i) {
    StreamEvent last;
    EXPECT_EQ(Collect(*streams[i], &last), want) << "request " << i;
    EXPECT_EQ(last.finish_reason, sync_finals[i].finish_reason) << "request " << i;
    EXPECT_EQ(last.output_tokens, static_cast<int>(k) + 1);
    EXPECT_EQ(sync[i], want);
  }
  EXPECT_EQ(sync_finals[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(sync_finals[1].finish_reason, FinishReason::kStop);
  EXPECT_EQ(sync_finals[2].finish_reason, FinishReason::kLength);
  // The stop was known only after the next step had gone out with the
  // sequence in it: k + 2 steps submitted for k + 1 tokens.
  const auto log = runner->log();
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& l) { return l.rfind("submit", 0) == 0; }),
            static_cast<int>(k) + 2);
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
  EXPECT_EQ(engine->Load().running, 0);
  // The wasted step left nothing behind: the same request runs the same.
  auto again = engine->Submit(stop);
  ASSERT_TRUE(again.ok());
  StepUntilIdle(*engine);
  EXPECT_EQ(Collect(**again), want);
}

TEST_F(EnginePipelineTest, CancelWhileAStepIsPending) {
  AsyncTestRunner* runner = nullptr;
  auto engine = MakeEngine(Kind::kAsync, 64, 256, &runner);
  const EngineRequest a = Request(RandomPrompt(40, 11), 50);
  const EngineRequest b = Request(RandomPrompt(33, 12), 20);
  auto sa = engine->Submit(a);
  auto sb = engine->Submit(b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine->StepForTest());
  ASSERT_EQ(runner->in_flight(), 1);  // a's next token is pending
  engine->Cancel((*sa)->id());
  StepUntilIdle(*engine);
  StreamEvent last;
  const std::vector<TokenId> got_a = Collect(**sa, &last);
  EXPECT_EQ(last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(got_a.size(), 3u) << "the tokens of the steps collected before the cancel only";
  StreamEvent more;
  EXPECT_FALSE((*sa)->Next(&more, absl::ZeroDuration())) << "nothing after the final event";
  const auto alone = RunAll(Kind::kCpu, {a, b}, 64, 256);
  EXPECT_EQ(got_a, std::vector<TokenId>(alone[0].begin(), alone[0].begin() + 3));
  EXPECT_EQ(Collect(**sb), alone[1]);
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
  EXPECT_EQ(runner->in_flight(), 0);
}

TEST_F(EnginePipelineTest, AFailedStepFailsItsRequestsAndTheEngineGoesOn) {
  AsyncTestRunner* runner = nullptr;
  auto engine = MakeEngine(Kind::kAsync, 64, 256, &runner);
  runner->FailCollectOf(3);
  auto s = engine->Submit(Request(RandomPrompt(25, 3), 10));
  ASSERT_TRUE(s.ok());
  StepUntilIdle(*engine);
  StreamEvent last;
  const std::vector<TokenId> got = Collect(**s, &last);
  EXPECT_EQ(last.error.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(got.size(), 2u);  // steps 1 and 2
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
  EXPECT_EQ(runner->in_flight(), 0);
  const EngineRequest next = Request(RandomPrompt(25, 4), 6);
  auto t = engine->Submit(next);
  ASSERT_TRUE(t.ok());
  StepUntilIdle(*engine);
  EXPECT_EQ(Collect(**t), RunAll(Kind::kCpu, {next}, 64, 256)[0]);
}

TEST_F(EnginePipelineTest, StepsThatNeedTheHostRunInBetween) {
  // Logprobs are computed on the host: such steps run synchronously, with
  // the pending step collected first and its placeholders filled in.
  AsyncTestRunner* runner = nullptr;
  auto engine = MakeEngine(Kind::kAsync, 64, 256, &runner);
  const EngineRequest a = Request(RandomPrompt(18, 21), 16);
  EngineRequest b = Request(RandomPrompt(22, 22), 5);
  b.logprobs = true;
  auto sa = engine->Submit(a);
  ASSERT_TRUE(sa.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine->StepForTest());
  auto sb = engine->Submit(b);
  ASSERT_TRUE(sb.ok());
  StepUntilIdle(*engine);
  const auto alone = RunAll(Kind::kCpu, {a, b}, 64, 256);
  EXPECT_EQ(Collect(**sa), alone[0]);
  EXPECT_EQ(Collect(**sb), alone[1]);
  const auto log = runner->log();
  EXPECT_TRUE(std::any_of(log.begin(), log.end(),
                          [](const std::string& l) { return l.rfind("forward", 0) == 0; }));
  // After b, a pipelines again.
  EXPECT_EQ(log.back().rfind("collect", 0), 0u);
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tessera::engine
