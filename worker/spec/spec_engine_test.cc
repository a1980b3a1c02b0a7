// Speculative decoding through the engine on the CPU runner:
//  - temperature 0: outputs identical with and without speculation, for
//    every draft source (n-gram, suffix, a different draft model, the target
//    itself as its own draft), alone and batched on a cache small enough to
//    preempt, with EOS, stop ids and max_tokens cutting accepted tokens;
//  - temperature > 0: the joint distribution of the first three generated
//    tokens of a small-vocabulary model matches the exact target
//    distribution (chi-square, fixed seeds, significance 1e-3), and the same
//    test rejects a biased verifier input (drafts sent with a q other than
//    the distribution they were drawn from);
//  - token trees: the same identity with every source proposing trees, on
//    the CPU runner (tree attention, KV compaction) and on a runner without
//    tree attention (the engine keeps the first-child chain); the sampling
//    walk's joint distribution at temperature > 0 with tree drafts;
//  - adaptive draft length.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"
#include "worker/spec/chi_square.h"
#include "worker/spec/model_source.h"

namespace tessera::spec {
namespace {

using engine::Engine;
using engine::EngineOptions;
using engine::EngineRequest;
using engine::RequestStream;
using engine::StreamEvent;

std::string WriteModel(runner::TestModelSpec spec) {
  std::string pattern = "/tmp/tessera-spec-engine-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  EXPECT_TRUE(runner::WriteTestModel(dir, spec).ok());
  return dir;
}

struct Result {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;  // when the request asked for them
  StreamEvent final_event;
};

// Checks a speculative run against plain decoding's results (tokens, finish
// reason, output count; no more accepted than drafted tokens) and returns the
// summed draft and accepted tokens.
std::pair<int, int> ExpectSameAsPlain(const std::vector<Result>& got,
                                      const std::vector<Result>& expected,
                                      const std::string& label) {
  int drafted = 0, accepted = 0;
  EXPECT_EQ(got.size(), expected.size()) << label;
  for (size_t i = 0; i < got.size() && i < expected.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected[i].tokens) << label << " request " << i;
    EXPECT_EQ(got[i].final_event.finish_reason, expected[i].final_event.finish_reason);
    EXPECT_EQ(got[i].final_event.output_tokens, expected[i].final_event.output_tokens);
    drafted += got[i].final_event.draft_tokens;
    accepted += got[i].final_event.accepted_tokens;
    EXPECT_LE(got[i].final_event.accepted_tokens, got[i].final_event.draft_tokens);
  }
  return {drafted, accepted};
}

std::vector<Result> RunAll(Engine& engine, const std::vector<EngineRequest>& requests,
                           bool one_at_a_time) {
  std::vector<Result> results(requests.size());
  auto collect = [](RequestStream& s, Result* r) {
    StreamEvent e;
    while (true) {
      if (!s.Next(&e, absl::Seconds(120))) {
        ADD_FAILURE() << "stream timed out";
        return;
      }
      EXPECT_TRUE(e.error.ok()) << e.error;
      for (const engine::TokenReport& t : e.tokens) {
        r->tokens.push_back(t.token);
        r->logprobs.push_back(t.logprob);
      }
      if (e.finished) break;
    }
    r->final_event = e;
  };
  if (one_at_a_time) {
    for (size_t i = 0; i < requests.size(); ++i) {
      auto s = engine.Submit(requests[i]);
      EXPECT_TRUE(s.ok()) << s.status();
      collect(**s, &results[i]);
    }
    return results;
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) {
    auto s = engine.Submit(r);
    EXPECT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < streams.size(); ++i) collect(*streams[i], &results[i]);
  return results;
}

// A runner without tree attention (as the simulated and CPU tensor-parallel
// runners are): the CPU runner behind the default capability.
class ChainOnlyRunner final : public runner::ModelRunner {
 public:
  explicit ChainOnlyRunner(std::unique_ptr<runner::ModelRunner> inner) : inner_(std::move(inner)) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override {
    if (!batch.tree_parents.empty()) return absl::InvalidArgumentError("no tree attention here");
    return inner_->Forward(batch, logits);
  }

 private:
  std::unique_ptr<runner::ModelRunner> inner_;
};

// A runner that "samples on its device" (as the CUDA runner does): it
// returns only each row's argmax (ties to the lowest id, as the sampler's
// greedy draw), so greedy drafts are verified from argmaxes alone.
class ArgmaxDeviceRunner final : public runner::ModelRunner {
 public:
  explicit ArgmaxDeviceRunner(std::unique_ptr<runner::ModelRunner> inner)
      : inner_(std::move(inner)) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  bool SupportsTreeAttention() const override { return inner_->SupportsTreeAttention(); }
  absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) override {
    return inner_->CopyKvSlots(from, to);
  }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override {
    ++host_steps;
    return inner_->Forward(batch, logits);
  }
  bool SupportsDeviceSampling() const override { return true; }
  absl::Status ForwardSample(const runner::ForwardBatch& batch,
                             absl::Span<const runner::DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override {
    std::vector<float> logits;
    if (absl::Status s = inner_->Forward(batch, &logits); !s.ok()) return s;
    const int64_t vocab = config().vocab_size;
    tokens->clear();
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* row = logits.data() + r * vocab;
      tokens->push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    ++device_steps;
    return absl::OkStatus();
  }
  int host_steps = 0;
  int device_steps = 0;

 private:
  std::unique_ptr<runner::ModelRunner> inner_;
};

// Passes Open/Commit/Close through to `inner`; subclasses change GetDrafts.
class ForwardingProvider : public DraftProvider {
 public:
  explicit ForwardingProvider(std::shared_ptr<DraftProvider> inner) : inner_(std::move(inner)) {}
  void Open(SeqKey s, absl::Span<const TokenId> t, const sampling::SamplingParams& p,
            int k) override {
    inner_->Open(s, t, p, k);
  }
  void Commit(SeqKey s, int64_t b, absl::Span<const TokenId> t, int k) override {
    inner_->Commit(s, b, t, k);
  }
  void Close(SeqKey s) override { inner_->Close(s); }

 protected:
  std::shared_ptr<DraftProvider> inner_;
};

// Counts the proposals that are trees (and passes everything through).
class TreeCounter final : public ForwardingProvider {
 public:
  using ForwardingProvider::ForwardingProvider;
  std::vector<std::optional<Draft>> GetDrafts(absl::Span<const ProposalRequest> r) override {
    auto d = inner_->GetDrafts(r);
    for (const auto& x : d) trees += x && !IsChain(*x);
    return d;
  }
  int trees = 0;
};

class SpecEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    runner::TestModelSpec target;
    target.vocab = 256;
    target.hidden = 64;
    target.intermediate = 128;
    target.layers = 2;
    target.heads = 4;
    target.kv_heads = 2;
    target.head_dim = 16;
    target.tie_embeddings = true;
    target_dir_ = new std::string(WriteModel(target));
    // The draft model is the target's first layer (same seed, tied
    // embeddings): it agrees with the target often but not always.
    runner::TestModelSpec draft = target;
    draft.layers = 1;
    draft_dir_ = new std::string(WriteModel(draft));
    auto t = model::LoadModel(*target_dir_);
    ASSERT_TRUE(t.ok()) << t.status();
    target_ = t->release();
    // A second target with untied embeddings: less repetitive output.
    target.tie_embeddings = false;
    target.seed = 21;
    untied_dir_ = new std::string(WriteModel(target));
    untied_ = model::LoadModel(*untied_dir_)->release();
  }

  enum class Source { kNone, kNgram, kSuffix, kDraftModel, kSelfModel };

  static std::shared_ptr<DraftProvider> MakeProvider(Source source, bool untied,
                                                     TreeOptions tree = {}) {
    ModelSourceFromDirOptions mo;
    mo.block_size = 8;
    mo.num_kv_blocks = 512;
    mo.source.tree = tree;
    NgramOptions no;
    no.tree = tree;
    SuffixOptions so;
    so.tree = tree;
    switch (source) {
      case Source::kNone:
        return nullptr;
      case Source::kNgram:
        return std::make_shared<LocalDraftProvider>(MakeNgramSource(no));
      case Source::kSuffix:
        return std::make_shared<LocalDraftProvider>(MakeSuffixSource(so));
      case Source::kDraftModel:
      case Source::kSelfModel: {
        auto s = MakeModelSourceFromDir(
            source == Source::kDraftModel ? *draft_dir_ : (untied ? *untied_dir_ : *target_dir_),
            mo);
        EXPECT_TRUE(s.ok()) << s.status();
        return std::make_shared<LocalDraftProvider>(std::move(*s));
      }
    }
    return nullptr;
  }

  static std::unique_ptr<Engine> MakeEngine(Source source, int num_blocks, int max_batched,
                                            int k = 4, bool adaptive = true, bool untied = false,
                                            std::shared_ptr<DraftProvider> provider = nullptr,
                                            bool chain_only_runner = false) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 8;
    ro.num_kv_blocks = num_blocks;
    auto cpu = runner::CpuModelRunner::Create(untied ? untied_ : target_, ro);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    std::unique_ptr<runner::ModelRunner> r = std::move(*cpu);
    if (chain_only_runner) r = std::make_unique<ChainOnlyRunner>(std::move(r));
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = max_batched;
    eo.scheduler.max_num_seqs = 32;
    eo.scheduler.max_model_len = 1024;
    eo.scheduler.watermark = 0;
    eo.eos_token_ids = {2};
    eo.draft_provider = provider ? provider : MakeProvider(source, untied);
    eo.speculation.num_speculative_tokens = source == Source::kNone ? 0 : k;
    eo.speculation.adaptive = adaptive;
    auto e = Engine::Create(std::move(r), eo);
    EXPECT_TRUE(e.ok()) << e.status();
    (*e)->Start();
    return std::move(*e);
  }

  static std::string* target_dir_;
  static std::string* draft_dir_;
  static std::string* untied_dir_;
  static model::LoadedModel* target_;
  static model::LoadedModel* untied_;
};
std::string* SpecEngineTest::untied_dir_ = nullptr;
model::LoadedModel* SpecEngineTest::untied_ = nullptr;
std::string* SpecEngineTest::target_dir_ = nullptr;
std::string* SpecEngineTest::draft_dir_ = nullptr;
model::LoadedModel* SpecEngineTest::target_ = nullptr;

std::vector<EngineRequest> GreedyRequests() {
  std::vector<EngineRequest> requests;
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    // Prompts with repeats give the model-free sources something to find.
    const int n = 4 + (i * 13) % 40;
    for (int j = 0; j < n; ++j) r.prompt.push_back(static_cast<TokenId>(3 + rng() % 40));
    if (i % 3 == 0) r.prompt.insert(r.prompt.end(), r.prompt.begin(), r.prompt.end());
    r.max_tokens = 10 + (i * 7) % 30;
    r.sampling.temperature = 0;
    r.ignore_eos = i % 4 != 0;
    requests.push_back(r);
  }
  return requests;
}

TEST_F(SpecEngineTest, GreedyOutputsAreIdenticalForEverySourceAndBatchComposition) {
  for (bool untied : {false, true}) {
    std::vector<EngineRequest> requests = GreedyRequests();
    // Stop ids taken from a plain run's outputs, so they do trigger mid-way.
    {
      auto plain = MakeEngine(Source::kNone, 512, 256, 4, true, untied);
      std::vector<Result> base = RunAll(*plain, requests, /*one_at_a_time=*/false);
      for (size_t i = 0; i < requests.size(); i += 2) {
        if (base[i].tokens.size() > 6) requests[i].stop_token_ids = {base[i].tokens[5]};
      }
    }
    auto plain = MakeEngine(Source::kNone, 512, 256, 4, true, untied);
    const std::vector<Result> expected = RunAll(*plain, requests, false);
    plain.reset();
    int stopped = 0;
    for (const Result& r : expected)
      stopped += r.final_event.finish_reason == engine::FinishReason::kStop;
    EXPECT_GT(stopped, 2);

    for (Source source :
         {Source::kNgram, Source::kSuffix, Source::kDraftModel, Source::kSelfModel}) {
      struct Shape {
        const char* name;
        int blocks, batched;
        bool alone;
        int k;
        bool adaptive;
      };
      for (const Shape& shape : {Shape{"alone", 512, 256, true, 4, true},
                                 Shape{"batched-preempting", 24, 48, false, 5, false},
                                 Shape{"batched-tight-budget", 512, 20, false, 3, true}}) {
        auto engine =
            MakeEngine(source, shape.blocks, shape.batched, shape.k, shape.adaptive, untied);
        std::vector<Result> got = RunAll(*engine, requests, shape.alone);
        if (std::string(shape.name) == "batched-preempting") {
          EXPECT_GT(engine->Load().preemptions, 0) << "the shape meant to exercise preemption";
        }
        const auto [drafted, accepted] = ExpectSameAsPlain(
            got, expected, absl::StrCat("source ", static_cast<int>(source), " ", shape.name));
        std::cout << (untied ? "untied " : "tied ") << "source " << static_cast<int>(source) << " "
                  << shape.name << ": drafted " << drafted << " accepted " << accepted << "\n";
        EXPECT_GT(drafted, 0) << shape.name;
        // The untied target and the draft model share nothing: no acceptance
        // is expected there.
        if (!(untied && source == Source::kDraftModel)) {
          EXPECT_GT(accepted, 0) << shape.name;
        }
        if (source == Source::kSelfModel) {
          EXPECT_EQ(accepted, drafted) << "a model drafting for itself is always right";
        }
      }
    }
  }
}

// Greedy drafts verified from the device's argmaxes (the engine's device
// sampling path) give plain decoding's tokens, and accept drafts.
TEST_F(SpecEngineTest, GreedyDraftsVerifiedOnTheDeviceGiveThePlainTokens) {
  const std::vector<EngineRequest> requests = GreedyRequests();
  auto plain = MakeEngine(Source::kNone, 512, 256);
  const std::vector<Result> expected = RunAll(*plain, requests, false);
  plain.reset();
  runner::CpuRunnerOptions ro;
  ro.block_size = 8;
  ro.num_kv_blocks = 512;
  auto cpu = runner::CpuModelRunner::Create(target_, ro);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto device = std::make_unique<ArgmaxDeviceRunner>(std::move(*cpu));
  ArgmaxDeviceRunner* runner = device.get();
  EngineOptions eo;
  eo.scheduler.max_num_batched_tokens = 256;
  eo.scheduler.max_num_seqs = 32;
  eo.scheduler.max_model_len = 1024;
  eo.scheduler.watermark = 0;
  eo.eos_token_ids = {2};
  eo.draft_provider = MakeProvider(Source::kDraftModel, false);
  eo.speculation.num_speculative_tokens = 4;
  auto engine = Engine::Create(std::move(device), eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->Start();
  const std::vector<Result> got = RunAll(**engine, requests, false);
  (*engine)->Stop();
  const auto [drafted, accepted] = ExpectSameAsPlain(got, expected, "device argmax");
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(runner->device_steps, 0);
  EXPECT_EQ(runner->host_steps, 0) << "greedy chains never need the host's logits";
}

TEST_F(SpecEngineTest, GreedyOutputsAreIdenticalWithTokenTrees) {
  TreeOptions tree;
  tree.max_branching = 3;
  tree.branch_depth = 2;
  for (bool untied : {false, true}) {
    std::vector<EngineRequest> requests = GreedyRequests();
    // Logprobs too: they see every context token's K/V, so a node's K/V left
    // in the wrong slot after a tree verification shows even where the
    // argmax does not change.
    for (EngineRequest& r : requests) r.logprobs = true;
    {
      auto plain = MakeEngine(Source::kNone, 512, 256, 4, true, untied);
      std::vector<Result> base = RunAll(*plain, requests, /*one_at_a_time=*/false);
      for (size_t i = 0; i < requests.size(); i += 2) {
        if (base[i].tokens.size() > 6) requests[i].stop_token_ids = {base[i].tokens[5]};
      }
    }
    auto plain = MakeEngine(Source::kNone, 512, 256, 4, true, untied);
    const std::vector<Result> expected = RunAll(*plain, requests, false);
    plain.reset();
    for (Source source :
         {Source::kNgram, Source::kSuffix, Source::kDraftModel, Source::kSelfModel}) {
      struct Shape {
        const char* name;
        int blocks, batched;
        bool alone;
        int k;
        bool adaptive;
        bool chain_only_runner;
      };
      for (const Shape& shape : {Shape{"alone", 512, 256, true, 6, true, false},
                                 Shape{"batched-preempting", 24, 48, false, 5, false, false},
                                 Shape{"batched-tight-budget", 512, 20, false, 4, true, false},
                                 Shape{"chain-only-runner", 512, 256, false, 5, false, true}}) {
        auto counter = std::make_shared<TreeCounter>(MakeProvider(source, untied, tree));
        auto engine = MakeEngine(source, shape.blocks, shape.batched, shape.k, shape.adaptive,
                                 untied, counter, shape.chain_only_runner);
        std::vector<Result> got = RunAll(*engine, requests, shape.alone);
        if (std::string(shape.name) == "batched-preempting") {
          EXPECT_GT(engine->Load().preemptions, 0) << "the shape meant to exercise preemption";
        }
        const auto [drafted, accepted] = ExpectSameAsPlain(
            got, expected, absl::StrCat("source ", static_cast<int>(source), " ", shape.name));
        for (size_t i = 0; i < requests.size(); ++i) {
          ASSERT_EQ(got[i].logprobs.size(), expected[i].logprobs.size());
          for (size_t j = 0; j < got[i].logprobs.size(); ++j) {
            EXPECT_NEAR(got[i].logprobs[j], expected[i].logprobs[j], 1e-3)
                << "source " << static_cast<int>(source) << " " << shape.name << " request " << i
                << " token " << j;
          }
        }
        std::cout << (untied ? "untied " : "tied ") << "tree source " << static_cast<int>(source)
                  << " " << shape.name << ": trees " << counter->trees << " drafted " << drafted
                  << " accepted " << accepted << "\n";
        EXPECT_GT(drafted, 0) << shape.name;
        if (!(untied && source == Source::kDraftModel)) {
          EXPECT_GT(accepted, 0) << shape.name;
        }
        // The draft model branches at every proposal of 2+ tokens; the
        // model-free sources where earlier occurrences continue differently.
        if (source == Source::kDraftModel || source == Source::kSelfModel) {
          EXPECT_GT(counter->trees, 0) << shape.name;
        }
      }
    }
  }
}

// Replaces each draft's q by the uniform distribution, which is not what the
// draft was drawn from: the acceptance test and the residual then use the
// wrong q and the output is biased (a deliberately wrong rule; dropping q
// altogether would not be wrong: the one-hot rule is exact for any draft).
class WrongQ final : public ForwardingProvider {
 public:
  WrongQ(std::shared_ptr<DraftProvider> inner, int vocab)
      : ForwardingProvider(std::move(inner)), vocab_(vocab) {}
  std::vector<std::optional<Draft>> GetDrafts(absl::Span<const ProposalRequest> r) override {
    auto d = inner_->GetDrafts(r);
    for (auto& x : d) {
      if (!x) continue;
      for (DraftDistribution& q : x->q) {
        q.tokens.clear();
        q.probs.clear();
        for (int t = 0; t < vocab_; ++t) {
          q.tokens.push_back(t);
          q.probs.push_back(1.0f);
        }
      }
    }
    return d;
  }

 private:
  int vocab_;
};

class LosslessTest : public ::testing::Test {
 public:
  static constexpr int kVocab = 8;
  static constexpr int kSamples = 12000;
  static constexpr double kAlpha = 1e-3;

  static void SetUpTestSuite() {
    runner::TestModelSpec t;
    t.vocab = kVocab;
    t.hidden = 32;
    t.intermediate = 64;
    t.layers = 1;
    t.heads = 2;
    t.kv_heads = 1;
    t.head_dim = 16;
    t.weight_scale = 0.3f;
    target_dir_ = new std::string(WriteModel(t));
    t.seed = 1234;
    draft_dir_ = new std::string(WriteModel(t));
    target_ = model::LoadModel(*target_dir_)->release();
  }

  static sampling::SamplingParams Params() {
    sampling::SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 0.95f;
    return p;
  }

  // Exact probabilities of the first three tokens after the prompt.
  static std::vector<double> ExactJoint(const std::vector<TokenId>& prompt) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 8;
    ro.num_kv_blocks = 4;
    auto r = runner::CpuModelRunner::Create(target_, ro);
    EXPECT_TRUE(r.ok());
    std::vector<double> joint(kVocab * kVocab * kVocab);
    sampling::TokenCounts counts;
    auto dist = [&](absl::Span<const float> row) {
      std::vector<double> p(kVocab);
      auto d = sampling::ComputeSamplingDistribution(row, Params(), counts);
      for (size_t i = 0; i < d->tokens.size(); ++i) p[d->tokens[i]] = d->probs[i];
      return p;
    };
    for (int a = 0; a < kVocab; ++a) {
      for (int b = 0; b < kVocab; ++b) {
        std::vector<TokenId> seq = prompt;
        seq.push_back(a);
        seq.push_back(b);
        runner::ForwardBatch fb;
        fb.block_table_stride = 1;
        fb.AddSequence(seq, 0, {0}, 8, false);
        const int n = static_cast<int>(seq.size());
        fb.logits_indices = {n - 3, n - 2, n - 1};
        std::vector<float> logits;
        EXPECT_TRUE((*r)->Forward(fb, &logits).ok());
        auto p1 = dist(absl::MakeConstSpan(logits).subspan(0, kVocab));
        auto p2 = dist(absl::MakeConstSpan(logits).subspan(kVocab, kVocab));
        auto p3 = dist(absl::MakeConstSpan(logits).subspan(2 * kVocab, kVocab));
        for (int c = 0; c < kVocab; ++c)
          joint[(a * kVocab + b) * kVocab + c] = p1[a] * p2[b] * p3[c];
      }
    }
    return joint;
  }

  static std::vector<int64_t> Histogram(std::shared_ptr<DraftProvider> provider,
                                        const std::vector<TokenId>& prompt, int64_t* drafted,
                                        int k = 2) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 8;
    ro.num_kv_blocks = 1024;
    auto r = runner::CpuModelRunner::Create(target_, ro);
    EngineOptions eo;
    eo.scheduler.max_num_seqs = 256;
    eo.scheduler.max_num_batched_tokens = 2048;
    eo.scheduler.max_model_len = 64;
    eo.max_waiting = kSamples + 1;
    eo.draft_provider = provider;
    eo.speculation.num_speculative_tokens = provider ? k : 0;
    eo.speculation.adaptive = false;
    auto engine = Engine::Create(std::move(*r), eo);
    (*engine)->Start();
    std::vector<EngineRequest> requests;
    for (int i = 0; i < kSamples; ++i) {
      EngineRequest q;
      q.prompt = prompt;
      q.max_tokens = k + 2;  // token 1 from the prefill, then k drafts + a bonus
      q.ignore_eos = true;
      q.sampling = Params();
      q.sampling.seed = 7777 + i;
      requests.push_back(q);
    }
    std::vector<Result> got = RunAll(**engine, requests, false);
    std::vector<int64_t> hist(kVocab * kVocab * kVocab);
    *drafted = 0;
    for (const Result& g : got) {
      EXPECT_EQ(g.tokens.size(), static_cast<size_t>(k + 2));
      if (g.tokens.size() < 3) continue;
      ++hist[(g.tokens[0] * kVocab + g.tokens[1]) * kVocab + g.tokens[2]];
      *drafted += g.final_event.draft_tokens;
    }
    return hist;
  }

  static std::shared_ptr<DraftProvider> ModelProvider(TreeOptions tree = {}) {
    ModelSourceFromDirOptions mo;
    mo.block_size = 8;
    mo.num_kv_blocks = 2048;
    mo.source.tree = tree;
    auto s = MakeModelSourceFromDir(*draft_dir_, mo);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::make_shared<LocalDraftProvider>(std::move(*s));
  }

  static std::string* target_dir_;
  static std::string* draft_dir_;
  static model::LoadedModel* target_;
};
std::string* LosslessTest::target_dir_ = nullptr;
std::string* LosslessTest::draft_dir_ = nullptr;
model::LoadedModel* LosslessTest::target_ = nullptr;

TEST_F(LosslessTest, FirstTokensFollowTheTargetDistributionWithSpeculation) {
  const std::vector<TokenId> prompt = {1, 5, 3};
  const std::vector<double> exact = ExactJoint(prompt);
  int64_t drafted = 0;
  // Control: plain decoding passes the same test.
  ChiSquareResult plain = ChiSquareGoodnessOfFit(Histogram(nullptr, prompt, &drafted), exact);
  EXPECT_GT(plain.p_value, kAlpha)
      << "chi2=" << plain.statistic << " df=" << plain.degrees_of_freedom;
  // Draft model with its exact q (sampled drafts).
  ChiSquareResult model =
      ChiSquareGoodnessOfFit(Histogram(ModelProvider(), prompt, &drafted), exact);
  EXPECT_GT(drafted, kSamples);  // speculation did run
  EXPECT_GT(model.p_value, kAlpha)
      << "chi2=" << model.statistic << " df=" << model.degrees_of_freedom;
  // Model-free drafts (one-hot q) at temperature > 0.
  ChiSquareResult ngram = ChiSquareGoodnessOfFit(
      Histogram(std::make_shared<LocalDraftProvider>(MakeSuffixSource()), prompt, &drafted), exact);
  EXPECT_GT(ngram.p_value, kAlpha) << "chi2=" << ngram.statistic;
  // Token trees (3 nodes: the draft model's chain of two and its runner-up
  // at the first position): the sample-and-match walk.
  TreeOptions tree;
  tree.max_branching = 3;
  auto tree_counter = std::make_shared<TreeCounter>(ModelProvider(tree));
  ChiSquareResult trees =
      ChiSquareGoodnessOfFit(Histogram(tree_counter, prompt, &drafted, /*k=*/3), exact);
  EXPECT_GT(tree_counter->trees, kSamples / 2);
  EXPECT_GT(trees.p_value, kAlpha) << "chi2=" << trees.statistic;
  // The deliberately wrong rule is caught.
  ChiSquareResult wrong = ChiSquareGoodnessOfFit(
      Histogram(std::make_shared<WrongQ>(ModelProvider(), kVocab), prompt, &drafted), exact);
  EXPECT_LT(wrong.p_value, kAlpha)
      << "chi2=" << wrong.statistic << " df=" << wrong.degrees_of_freedom;
  for (const auto& [name, r] :
       {std::pair{"plain", plain}, std::pair{"draft model", model}, std::pair{"suffix", ngram},
        std::pair{"trees", trees}, std::pair{"wrong q", wrong}}) {
    std::cout << name << ": chi2=" << r.statistic << " df=" << r.degrees_of_freedom
              << " p=" << r.p_value << "\n";
  }
}

TEST(AdaptiveDraftLengthTest, FollowsAcceptanceAndBatchSize) {
  SpeculationOptions o;
  o.num_speculative_tokens = 5;
  AdaptiveDraftLength a(o);
  EXPECT_EQ(a.Next(o, 1), 5);
  EXPECT_EQ(a.Next(o, 32), 0);  // off at large batches
  EXPECT_LT(a.Next(o, 16), 5);
  for (int i = 0; i < 20; ++i) a.Observe(o, 5, 1);
  EXPECT_EQ(a.Next(o, 1), 2);  // about one accepted: ask for two
  for (int i = 0; i < 30; ++i) a.Observe(o, 2, 0);
  int asked = 0;
  for (int i = 0; i < 32; ++i) asked += a.Next(o, 1);
  EXPECT_EQ(asked, 2);  // off, probing every 16 steps
  o.adaptive = false;
  EXPECT_EQ(a.Next(o, 100), 5);
  o.num_speculative_tokens = 0;
  EXPECT_EQ(a.Next(o, 1), 0);
}

}  // namespace
}  // namespace tessera::spec
