// The simulated runner: token rule, cost model, batch validation; through
// the engine: outputs independent of batching, chunking, prefix caching and
// migration, and prefix-cache hits cost no prefill time; the engine builder's
// simulation option and its spec parser.
#include "worker/runner/simulated_model_runner.h"

#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_engine.h"

namespace tessera::runner {
namespace {

using ::testing::HasSubstr;

constexpr int kBlock = 16;

// A batch of sequences, each with a private, contiguous block table.
class BatchBuilder {
 public:
  explicit BatchBuilder(int64_t stride) { batch_.block_table_stride = stride; }
  BatchBuilder& Add(const std::vector<int32_t>& tokens, int32_t start) {
    std::vector<int32_t> table;
    for (int64_t i = 0; i < batch_.block_table_stride; ++i) table.push_back(next_block_++);
    batch_.AddSequence(tokens, start, table, kBlock, /*want_logits=*/true);
    return *this;
  }
  ForwardBatch Build() const { return batch_; }

 private:
  ForwardBatch batch_;
  int32_t next_block_ = 0;
};

std::vector<int32_t> Iota(int n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

SimulatedRunnerOptions Costs(double prefill, double step, double per_seq) {
  SimulatedRunnerOptions o;
  o.vocab_size = 1024;
  o.max_position_embeddings = 4096;
  o.block_size = kBlock;
  o.num_kv_blocks = 1024;
  o.prefill_us_per_token = prefill;
  o.decode_step_us = step;
  o.decode_us_per_seq = per_seq;
  return o;
}

TEST(SimulatedModelRunnerTest, TokensStayInRangeAndDependOnEveryEarlierToken) {
  std::set<int32_t> seen;
  int differ_by_token = 0, differ_by_position = 0;
  for (int32_t token = 0; token < 200; ++token) {
    for (int32_t pos = 0; pos < 200; ++pos) {
      const uint64_t state = SimulatedModelRunner::PrefixState(7, token, pos);
      const int32_t t = SimulatedModelRunner::TokenAfter(state, 1024);
      ASSERT_GE(t, SimulatedModelRunner::kFirstGeneratedId);
      ASSERT_LT(t, 1024);
      seen.insert(t);
      differ_by_token += t != SimulatedModelRunner::TokenAfter(
                                  SimulatedModelRunner::PrefixState(7, token + 1, pos), 1024);
      differ_by_position += t != SimulatedModelRunner::TokenAfter(
                                     SimulatedModelRunner::PrefixState(7, token, pos + 1), 1024);
    }
  }
  // 40000 draws over 1021 ids: every id appears (the chance of missing one
  // is about 1021 * exp(-39) for a uniform hash).
  EXPECT_EQ(seen.size(), 1021u);
  EXPECT_GT(differ_by_token, 39000);
  EXPECT_GT(differ_by_position, 39000);
  // A change to the first of 20 tokens changes the continuation: the state
  // carries the whole prefix, not only the last token.
  std::vector<int32_t> a(20, 9), b(20, 9);
  b[0] = 10;
  const std::vector<int32_t> ca = SimulatedModelRunner::Continuation(a, 16, 1024);
  const std::vector<int32_t> cb = SimulatedModelRunner::Continuation(b, 16, 1024);
  int differ = 0;
  for (int i = 0; i < 16; ++i) differ += ca[i] != cb[i];
  EXPECT_GE(differ, 14);
  EXPECT_EQ(ca, SimulatedModelRunner::Continuation(a, 16, 1024));
  // The smallest vocabulary has exactly one generatable id.
  EXPECT_EQ(SimulatedModelRunner::TokenAfter(12345, 4), 3);
}

TEST(SimulatedModelRunnerTest, StepCostCountsPrefillTokensAndDecodeSequences) {
  const SimulatedRunnerOptions o = Costs(20, 2000, 50);
  // A 10-token prefill chunk and two decodes.
  ForwardBatch mixed = BatchBuilder(4).Add(Iota(10, 5), 0).Add({9}, 20).Add({11}, 33).Build();
  EXPECT_EQ(SimulatedModelRunner::StepCost(mixed, o), absl::Microseconds(20 * 10 + 2000 + 2 * 50));
  // Prefill only: no decode step cost. A chunk starting mid-prompt (the rest
  // came from the prefix cache) costs only its own tokens.
  ForwardBatch prefill = BatchBuilder(4).Add(Iota(7, 5), 0).Add(Iota(3, 5), 32).Build();
  EXPECT_EQ(SimulatedModelRunner::StepCost(prefill, o), absl::Microseconds(20 * 10));
  // Decodes only.
  ForwardBatch decode = BatchBuilder(2).Add({4}, 3).Add({4}, 5).Add({4}, 7).Build();
  EXPECT_EQ(SimulatedModelRunner::StepCost(decode, o), absl::Microseconds(2000 + 3 * 50));
  // Fractional microseconds are kept.
  EXPECT_EQ(SimulatedModelRunner::StepCost(prefill, Costs(0.5, 0, 0)), absl::Microseconds(5));
}

TEST(SimulatedModelRunnerTest, ForwardWaitsTheCostAndPutsTheWinnerAtTheRuleToken) {
  auto runner = SimulatedModelRunner::Create(Costs(100, 3000, 0));
  ASSERT_TRUE(runner.ok()) << runner.status();
  ForwardBatch batch = BatchBuilder(4).Add(Iota(20, 100), 0).Add(Iota(3, 500), 0).Build();
  const absl::Duration cost = SimulatedModelRunner::StepCost(batch, (*runner)->options());
  ASSERT_EQ(cost, absl::Microseconds(100 * (20 + 3)));  // two prefills, no decode
  std::vector<float> logits;
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*runner)->Forward(batch, &logits).ok());
  EXPECT_GE(absl::Now() - start, cost);
  ASSERT_EQ(logits.size(), 2u * 1024);
  const int32_t expected[2] = {SimulatedModelRunner::Continuation(Iota(20, 100), 1, 1024)[0],
                               SimulatedModelRunner::Continuation(Iota(3, 500), 1, 1024)[0]};
  for (int r = 0; r < 2; ++r) {
    for (int v = 0; v < 1024; ++v) {
      const float want = v == expected[r] ? SimulatedModelRunner::kWinningLogit : 0.0f;
      ASSERT_EQ(logits[r * 1024 + v], want) << "row " << r << " id " << v;
    }
  }
}

TEST(SimulatedModelRunnerTest, MalformedBatchesFailAtOnce) {
  // A one-second cost: a rejected batch must return without waiting for it.
  auto created = SimulatedModelRunner::Create(Costs(1e6, 1e6, 0));
  ASSERT_TRUE(created.ok());
  SimulatedModelRunner& runner = **created;
  const ForwardBatch good = BatchBuilder(2).Add(Iota(5, 10), 0).Add({7}, 20).Build();
  struct Case {
    const char* name;
    void (*mutate)(ForwardBatch&);
    const char* message;
  };
  const Case cases[] = {
      {"token id", [](ForwardBatch& b) { b.token_ids[2] = 1024; }, "ids must be in [0, 1024)"},
      {"negative id", [](ForwardBatch& b) { b.token_ids[0] = -1; }, "ids must be in"},
      {"position", [](ForwardBatch& b) { b.positions[3] = 9; }, "position 9"},
      {"slot", [](ForwardBatch& b) { b.slot_mapping[1] += 1; }, "block table puts position"},
      {"block id", [](ForwardBatch& b) { b.block_tables[0] = 5000; }, "the cache has 1024 blocks"},
      {"seq len", [](ForwardBatch& b) { b.seq_lens[0] = 3; }, "5 new tokens but seq_len 3"},
      {"context", [](ForwardBatch& b) { b.seq_lens[1] = 5000; }, "exceeds the model's context"},
      {"logits index", [](ForwardBatch& b) { b.logits_indices[0] = 6; }, "outside the batch"},
      {"query_start_loc", [](ForwardBatch& b) { b.query_start_loc.pop_back(); }, "query_start_loc"},
      {"empty", [](ForwardBatch& b) { b = ForwardBatch(); }, "empty batch"},
  };
  std::vector<float> logits;
  ASSERT_TRUE(SimulatedModelRunner::Create(Costs(0, 0, 0)).value()->Forward(good, &logits).ok());
  for (const Case& c : cases) {
    ForwardBatch bad = good;
    c.mutate(bad);
    const absl::Time start = absl::Now();
    absl::Status s = runner.Forward(bad, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500)) << c.name;
  }
}

// fail_after_steps: the steps before it run; from then on every step fails
// at once (a malformed batch too) and Health() says why; a rejected batch
// does not count as a step.
TEST(SimulatedModelRunnerTest, BreaksForGoodAfterFailAfterSteps) {
  SimulatedRunnerOptions o = Costs(0, 0, 0);
  o.fail_after_steps = 2;
  auto created = SimulatedModelRunner::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  SimulatedModelRunner& runner = **created;
  const ForwardBatch good = BatchBuilder(2).Add(Iota(5, 10), 0).Build();
  ForwardBatch bad = good;
  bad.token_ids[0] = -1;
  std::vector<float> logits;
  EXPECT_EQ(runner.Forward(bad, &logits).code(), absl::StatusCode::kInvalidArgument);
  for (int step = 0; step < 2; ++step) {
    EXPECT_TRUE(runner.Health().ok());
    ASSERT_TRUE(runner.Forward(good, &logits).ok()) << "step " << step;
  }
  EXPECT_EQ(runner.Health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(runner.Health().message()), HasSubstr("broke after 2 steps"));
  EXPECT_EQ(runner.Forward(good, &logits).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(runner.Forward(bad, &logits).code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(runner.Health().ok());
}

TEST(SimulatedModelRunnerTest, CreateRejectsOptionsOutOfRange) {
  SimulatedRunnerOptions o = Costs(0, 0, 0);
  o.vocab_size = 3;
  EXPECT_EQ(SimulatedModelRunner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Costs(-1, 0, 0);
  EXPECT_THAT(std::string(SimulatedModelRunner::Create(o).status().message()),
              HasSubstr("prefill_us_per_token"));
  o = Costs(0, 0, 0);
  o.max_position_embeddings = 0;
  EXPECT_EQ(SimulatedModelRunner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Costs(0, 0, 0);
  o.num_kv_blocks = 0;
  EXPECT_EQ(SimulatedModelRunner::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Costs(0, 0, 0);
  o.fail_after_steps = -1;
  EXPECT_THAT(std::string(SimulatedModelRunner::Create(o).status().message()),
              HasSubstr("fail_after_steps must be >= 0"));
  auto ok = SimulatedModelRunner::Create(Costs(0, 0, 0));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->config().vocab_size, 1024);
  EXPECT_EQ((*ok)->config().max_position_embeddings, 4096);
  EXPECT_EQ((*ok)->config().model_type, "simulated");
}

// ---- Through the engine ----

using engine::Engine;
using engine::EngineRequest;
using engine::StreamEvent;
using engine::TokenId;

// The output the rule gives for `prompt` followed by `n` tokens.
std::vector<TokenId> Reference(const std::vector<TokenId>& prompt, int n, int64_t vocab) {
  return SimulatedModelRunner::Continuation(prompt, n, vocab);
}

std::vector<TokenId> Prompt(int n, int seed, int vocab = 1024) {
  std::vector<TokenId> p(n);
  for (int i = 0; i < n; ++i) {
    p[i] = static_cast<TokenId>((seed * 7919 + i * 104729) % (vocab - 3) + 3);
  }
  return p;
}

EngineRequest Greedy(std::vector<TokenId> prompt, int max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

std::vector<TokenId> Collect(engine::RequestStream& s, StreamEvent* final_event) {
  std::vector<TokenId> tokens;
  StreamEvent e;
  while (s.Next(&e, absl::Seconds(60))) {
    for (const auto& t : e.tokens) tokens.push_back(t.token);
    if (e.finished) {
      *final_event = e;
      return tokens;
    }
  }
  ADD_FAILURE() << "stream timed out";
  return tokens;
}

class ModelTimeObserver : public engine::EngineObserver {
 public:
  void OnStep(const engine::ScheduledBatch&, absl::Duration model_time) override {
    total += model_time;
  }
  absl::Duration total;  // engine thread only; read after the request ends
};

std::unique_ptr<Engine> MakeEngine(SimulatedRunnerOptions ro, int max_batched_tokens,
                                   engine::EngineObserver* observer = nullptr) {
  auto r = SimulatedModelRunner::Create(ro);
  EXPECT_TRUE(r.ok()) << r.status();
  engine::EngineOptions eo;
  eo.scheduler.max_num_batched_tokens = max_batched_tokens;
  eo.scheduler.max_num_seqs = 64;
  eo.scheduler.max_model_len = static_cast<int>(ro.max_position_embeddings);
  eo.eos_token_ids = {2};
  auto e = Engine::Create(std::move(*r), eo, observer);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

TEST(SimulatedEngineTest, OutputsFollowTheRuleWhateverTheBatching) {
  // A small token budget forces chunked prefill and mixed batches; shared
  // prefixes give prefix-cache hits; a small cache forces preemption.
  SimulatedRunnerOptions ro = Costs(0, 0, 0);
  ro.num_kv_blocks = 48;
  auto engine = MakeEngine(ro, /*max_batched_tokens=*/40);
  engine->Start();
  std::vector<std::vector<TokenId>> prompts;
  const std::vector<TokenId> shared = Prompt(70, 1);
  for (int i = 0; i < 12; ++i) {
    std::vector<TokenId> p = i % 2 == 0 ? shared : Prompt(10 + 9 * i, i + 2);
    if (i % 2 == 0) p.push_back(static_cast<TokenId>(100 + i));
    prompts.push_back(p);
  }
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) {
    auto s = engine->Submit(Greedy(p, 60));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  int cached = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    StreamEvent fin;
    std::vector<TokenId> got = Collect(*streams[i], &fin);
    ASSERT_TRUE(fin.error.ok()) << fin.error;
    EXPECT_EQ(got, Reference(prompts[i], 60, 1024)) << "request " << i;
    cached += fin.cached_tokens;
  }
  EXPECT_GT(cached, 0) << "the shared prompts should have hit the prefix cache";
  EXPECT_GT(engine->Load().preemptions, 0) << "the small cache should have forced preemption";
}

TEST(SimulatedEngineTest, ResumedRequestContinuesExactly) {
  auto engine = MakeEngine(Costs(0, 0, 0), 256);
  engine->Start();
  const std::vector<TokenId> prompt = Prompt(33, 5);
  const std::vector<TokenId> full = Reference(prompt, 40, 1024);
  // As if 17 tokens had been generated on another worker.
  EngineRequest resumed = Greedy(prompt, 40);
  resumed.generated.assign(full.begin(), full.begin() + 17);
  auto s = engine->Submit(resumed);
  ASSERT_TRUE(s.ok()) << s.status();
  StreamEvent fin;
  std::vector<TokenId> rest = Collect(**s, &fin);
  ASSERT_TRUE(fin.error.ok()) << fin.error;
  EXPECT_EQ(rest, std::vector<TokenId>(full.begin() + 17, full.end()));
}

TEST(SimulatedEngineTest, PrefixCacheHitsSkipPrefillCost) {
  // 200 us per prefill token, nothing for decodes: a 512-token prompt costs
  // about 100 ms; the same prompt with a new 16-token suffix, after the
  // first has been cached, costs only its uncached tokens.
  ModelTimeObserver observer;
  auto engine = MakeEngine(Costs(200, 0, 0), 1024, &observer);
  engine->Start();
  const std::vector<TokenId> prompt = Prompt(512, 9);
  auto first = engine->Submit(Greedy(prompt, 1));
  ASSERT_TRUE(first.ok());
  StreamEvent fin;
  Collect(**first, &fin);
  ASSERT_TRUE(fin.error.ok());
  const absl::Duration cold = observer.total;
  EXPECT_GE(cold, absl::Microseconds(200 * 512));

  std::vector<TokenId> longer = prompt;
  for (int i = 0; i < 16; ++i) longer.push_back(static_cast<TokenId>(50 + i));
  auto second = engine->Submit(Greedy(longer, 1));
  ASSERT_TRUE(second.ok());
  Collect(**second, &fin);
  ASSERT_TRUE(fin.error.ok());
  EXPECT_GE(fin.cached_tokens, 512 - kBlock);
  const absl::Duration warm = observer.total - cold;
  EXPECT_LT(warm, cold / 4) << "cold " << cold << " warm " << warm;
}

// ---- The engine builder's simulation option ----

TEST(SimulatedEngineTest, ScriptedRepliesFollowTheSwitchTokensThenEos) {
  // Test-only scripted mode: reply = number of switch tokens in the prefix,
  // emitted whole after any prompt, then EOS; chunked prefill included.
  SimulatedRunnerOptions ro = Costs(0, 0, 0);
  ro.script = {{10, 11, 12}, {20, 21}};
  ro.script_switch_tokens = {7};
  auto engine = MakeEngine(ro, /*max_batched_tokens=*/16);
  engine->Start();
  auto run = [&](std::vector<TokenId> prompt) {
    EngineRequest r = Greedy(std::move(prompt), 10);
    r.ignore_eos = false;
    auto s = engine->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status();
    StreamEvent last;
    return Collect(**s, &last);
  };
  EXPECT_THAT(run(Iota(40, 30)), ::testing::ElementsAre(10, 11, 12, 2));
  std::vector<TokenId> with_switch = Iota(30, 30);
  with_switch[5] = 7;
  EXPECT_THAT(run(with_switch), ::testing::ElementsAre(20, 21, 2));
  // A prompt that ends in the reply's start continues it.
  EXPECT_THAT(run({5, 6, 10, 11}), ::testing::ElementsAre(12, 2));
  engine->Stop();
}

TEST(SimulationSpecTest, ParsesEveryKeyAndKeepsDefaults) {
  auto o = engine::ParseSimulationSpec(
      "vocab=2048, context=8192,prefill_us_per_token=12.5,decode_step_us=1500,"
      "decode_us_per_seq=40,kv_bytes_per_token=4096,fail_after_steps=7");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->vocab, 2048);
  EXPECT_EQ(o->context, 8192);
  EXPECT_EQ(o->prefill_us_per_token, 12.5);
  EXPECT_EQ(o->decode_step_us, 1500);
  EXPECT_EQ(o->decode_us_per_seq, 40);
  EXPECT_EQ(o->kv_bytes_per_token, 4096);
  EXPECT_EQ(o->fail_after_steps, 7);

  auto partial = engine::ParseSimulationSpec("decode_step_us=0");
  ASSERT_TRUE(partial.ok());
  const engine::SimulationOptions defaults;
  EXPECT_EQ(partial->decode_step_us, 0);
  EXPECT_EQ(partial->vocab, defaults.vocab);
  EXPECT_EQ(partial->prefill_us_per_token, defaults.prefill_us_per_token);

  auto empty = engine::ParseSimulationSpec("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->context, defaults.context);

  // The canonical string parses back to the same options.
  auto again = engine::ParseSimulationSpec(engine::SimulationSpecString(*o));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(engine::SimulationSpecString(*again), engine::SimulationSpecString(*o));
  EXPECT_EQ(again->prefill_us_per_token, 12.5);
  engine::SimulationOptions odd;
  odd.decode_us_per_seq = 0.1;
  auto odd_again = engine::ParseSimulationSpec(engine::SimulationSpecString(odd));
  ASSERT_TRUE(odd_again.ok());
  EXPECT_EQ(odd_again->decode_us_per_seq, 0.1);
}

TEST(SimulationSpecTest, RejectsBadSpecsNamingThePair) {
  const std::pair<const char*, const char*> bad[] = {
      {"vocab=1024,tokens=5", "'tokens=5': unknown key"},
      {"vocab=1024,vocab=2048", "'vocab=2048': key given twice"},
      {"vocab=big", "'vocab=big': not an integer"},
      {"vocab=3", "must be in [4, 1048576]"},
      {"context=0", "'context=0': must be in [1, "},
      {"decode_step_us=-5", "microseconds in [0, 1e9]"},
      {"prefill_us_per_token=nan", "'prefill_us_per_token=nan'"},
      {"decode_us_per_seq=fast", "not a number"},
      {"vocab", "'vocab': expected key=value"},
      {"kv_bytes_per_token=0", "must be in [1, "},
      {"fail_after_steps=-1", "'fail_after_steps=-1': must be in [0, "},
  };
  for (const auto& [spec, message] : bad) {
    auto o = engine::ParseSimulationSpec(spec);
    ASSERT_FALSE(o.ok()) << spec;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(message)) << spec;
  }
}

TEST(SimulatedLocalEngineTest, BuildsWithoutAModelAndServes) {
  engine::LocalEngineOptions lo;
  auto spec = engine::ParseSimulationSpec(
      "vocab=512,context=2048,prefill_us_per_token=1,decode_step_us=100,decode_us_per_seq=1");
  ASSERT_TRUE(spec.ok());
  lo.simulate = *spec;
  lo.kv_cache_memory_mb = 64;  // 64 MiB / (128 KiB per token * 16) = 32 blocks
  auto local = engine::BuildLocalEngine(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE((*local)->simulated);
  EXPECT_EQ((*local)->model, nullptr);
  EXPECT_EQ((*local)->kv_cache_blocks, 32);
  EXPECT_EQ((*local)->config().vocab_size, 512);
  EXPECT_EQ((*local)->engine->options().scheduler.max_model_len, 2048);
  EXPECT_FALSE((*local)->backends.ToTable().empty());
  Engine& e = *(*local)->engine;
  e.Start();
  ASSERT_TRUE(engine::WarmUp(e).ok());
  const std::vector<TokenId> prompt = Prompt(40, 3, 512);
  auto s = e.Submit(Greedy(prompt, 12));
  ASSERT_TRUE(s.ok()) << s.status();
  StreamEvent fin;
  EXPECT_EQ(Collect(**s, &fin), Reference(prompt, 12, 512));
  EXPECT_EQ(fin.output_tokens, 12);

  // An explicit block count wins; a bad backend override still fails.
  lo.kv_cache_blocks = 100;
  auto sized = engine::BuildLocalEngine(lo);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)->kv_cache_blocks, 100);
  EXPECT_EQ((*sized)->engine->runner().num_kv_blocks(), 100);
  lo.backends = {{"gemm_backend", "no-such-backend"}};
  EXPECT_FALSE(engine::BuildLocalEngine(lo).ok());
}

}  // namespace
}  // namespace tessera::runner
