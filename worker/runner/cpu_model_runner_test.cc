#include "worker/runner/cpu_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string pattern = "/tmp/tessera-runner-XXXXXX";
  char* dir = mkdtemp(pattern.data());
  return dir ? std::string(dir) : "/tmp";
}

class CpuModelRunnerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string dir = TempDir();
    TestModelSpec spec;
    spec.architecture = GetParam();
    ASSERT_TRUE(WriteTestModel(dir, spec).ok());
    auto loaded = model::LoadModel(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
  }

  std::unique_ptr<CpuModelRunner> MakeRunner(const std::string& backend = "cpu") {
    CpuRunnerOptions o;
    o.block_size = 4;
    o.num_kv_blocks = 64;
    o.kernels =
        backend == "cpu" ? &kernels::OptimizedCpuKernels() : &kernels::ReferenceCpuKernels();
    auto r = CpuModelRunner::Create(model_.get(), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  static std::vector<int32_t> Blocks(int first, int count) {
    std::vector<int32_t> b(count);
    std::iota(b.begin(), b.end(), first);
    return b;
  }

  static std::vector<int32_t> Prompt(int n, int seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  }

  // Logits of every prompt position, in one prefill.
  static std::vector<float> PrefillAll(CpuModelRunner& r, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& blocks) {
    ForwardBatch b;
    b.block_table_stride = static_cast<int64_t>(blocks.size());
    b.AddSequence(prompt, 0, blocks, r.block_size(), false);
    for (int i = 0; i < static_cast<int>(prompt.size()); ++i) b.logits_indices.push_back(i);
    std::vector<float> logits;
    EXPECT_TRUE(r.Forward(b, &logits).ok());
    return logits;
  }

  std::unique_ptr<model::LoadedModel> model_;
};

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Tolerances: every path computes in fp32 with the same weights; they
// differ only in summation order (GEMM blocking, attention chunking), which
// moves logits of magnitude ~1-10 by well under 1e-4.
constexpr float kTolerance = 1e-4f;

TEST_P(CpuModelRunnerTest, PrefillEqualsTokenByTokenDecode) {
  auto runner = MakeRunner();
  const int vocab = 256;
  std::vector<int32_t> prompt = Prompt(37, 1);
  std::vector<float> full = PrefillAll(*runner, prompt, Blocks(0, 10));
  std::vector<float> step_logits;
  for (int i = 0; i < static_cast<int>(prompt.size()); ++i) {
    ForwardBatch b;
    b.block_table_stride = 10;
    b.AddSequence({prompt[i]}, i, Blocks(20, 10), runner->block_size(), true);
    std::vector<float> logits;
    ASSERT_TRUE(runner->Forward(b, &logits).ok());
    step_logits.insert(step_logits.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(full.size(), static_cast<size_t>(prompt.size() * vocab));
  EXPECT_LT(MaxAbsDiff(full, step_logits), kTolerance);
}

TEST_P(CpuModelRunnerTest, ChunkedPrefillEqualsOnePass) {
  auto runner = MakeRunner();
  std::vector<int32_t> prompt = Prompt(40, 2);
  std::vector<float> full = PrefillAll(*runner, prompt, Blocks(0, 10));
  std::vector<float> last(full.end() - 256, full.end());
  std::vector<float> chunked;
  int start = 0;
  for (int len : {17, 16, 7}) {
    ForwardBatch b;
    b.block_table_stride = 10;
    std::vector<int32_t> chunk(prompt.begin() + start, prompt.begin() + start + len);
    b.AddSequence(chunk, start, Blocks(30, 10), runner->block_size(), true);
    ASSERT_TRUE(runner->Forward(b, &chunked).ok());
    start += len;
  }
  EXPECT_LT(MaxAbsDiff(last, chunked), kTolerance);
}

TEST_P(CpuModelRunnerTest, BatchedSequencesEqualSequencesAlone) {
  auto runner = MakeRunner();
  std::vector<int32_t> a = Prompt(13, 3), b = Prompt(29, 4);
  std::vector<float> alone_a = PrefillAll(*runner, a, Blocks(0, 8));
  std::vector<float> alone_b = PrefillAll(*runner, b, Blocks(8, 8));
  ForwardBatch batch;
  batch.block_table_stride = 8;
  batch.AddSequence(a, 0, Blocks(16, 8), runner->block_size(), true);
  batch.AddSequence(b, 0, Blocks(24, 8), runner->block_size(), true);
  std::vector<float> logits;
  ASSERT_TRUE(runner->Forward(batch, &logits).ok());
  std::vector<float> want(alone_a.end() - 256, alone_a.end());
  want.insert(want.end(), alone_b.end() - 256, alone_b.end());
  EXPECT_LT(MaxAbsDiff(logits, want), kTolerance);
}

TEST_P(CpuModelRunnerTest, OptimizedMatchesReferenceKernels) {
  auto fast = MakeRunner("cpu");
  auto ref = MakeRunner("cpu_reference");
  std::vector<int32_t> prompt = Prompt(33, 5);
  EXPECT_LT(
      MaxAbsDiff(PrefillAll(*fast, prompt, Blocks(0, 9)), PrefillAll(*ref, prompt, Blocks(0, 9))),
      kTolerance);
}

TEST_P(CpuModelRunnerTest, MalformedBatchesAreRejectedWithoutComputing) {
  auto runner = MakeRunner();
  std::vector<float> logits;
  {
    ForwardBatch b;
    b.block_table_stride = 2;
    b.AddSequence({5, 256}, 0, Blocks(0, 2), runner->block_size(), true);
    absl::Status s = runner->Forward(b, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("256"));
  }
  {
    ForwardBatch b;
    b.block_table_stride = 2;
    b.AddSequence({5, 6}, 0, Blocks(0, 2), runner->block_size(), true);
    b.positions[1] = 7;
    EXPECT_EQ(runner->Forward(b, &logits).code(), absl::StatusCode::kInvalidArgument);
  }
  {
    ForwardBatch b;
    b.block_table_stride = 2;
    b.AddSequence({5, 6}, 0, {64, 65}, runner->block_size(), true);  // blocks outside the cache
    EXPECT_EQ(runner->Forward(b, &logits).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(runner->Forward(ForwardBatch{}, &logits).code(), absl::StatusCode::kInvalidArgument);
}

// Token trees: one forward pass over a tree (tree_parents) gives every node
// the logits of its root-to-node path computed as a chain; after the K/V of
// one path are moved to contiguous slots (CopyKvSlots), decoding continues
// exactly as if the path had been decoded as a chain. Both kernel sets.
TEST_P(CpuModelRunnerTest, TreeForwardEqualsEachPathAsAChain) {
  for (const std::string backend : {"cpu", "cpu_reference"}) {
    auto tree = MakeRunner(backend);
    auto chain = MakeRunner(backend);
    ASSERT_TRUE(tree && chain);
    ASSERT_TRUE(tree->SupportsTreeAttention());
    const std::vector<int32_t> prompt = Prompt(11, 3);
    const std::vector<int32_t> blocks = Blocks(0, 8);
    std::vector<float> logits;
    // The prompt but its last token, cached.
    ForwardBatch pre;
    pre.block_table_stride = 8;
    pre.AddSequence(std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 0, blocks,
                    tree->block_size(), false);
    ASSERT_TRUE(tree->Forward(pre, &logits).ok());
    // The last prompt token, then 8 draft nodes (node i hangs off 1 + parents[i]).
    const std::vector<int32_t> nodes = {17, 42, 99, 5, 42, 7, 63, 8};
    const std::vector<int32_t> parents = {-1, -1, 0, 0, 1, 2, 4, 6};
    std::vector<int32_t> chunk = {prompt.back()};
    chunk.insert(chunk.end(), nodes.begin(), nodes.end());
    ForwardBatch b;
    b.block_table_stride = 8;
    b.AddSequence(chunk, 10, blocks, tree->block_size(), false);
    b.tree_parents = {-1};
    std::vector<int> depth = {0};
    for (size_t i = 0; i < nodes.size(); ++i) {
      b.tree_parents.push_back(parents[i] + 1);
      depth.push_back(depth[parents[i] + 1] + 1);
    }
    for (size_t j = 0; j < chunk.size(); ++j) {
      b.positions[j] = 10 + depth[j];
      b.logits_indices.push_back(static_cast<int32_t>(j));
    }
    ASSERT_TRUE(tree->Forward(b, &logits).ok());
    const int64_t vocab = model_->config.vocab_size;
    for (size_t j = 0; j < chunk.size(); ++j) {
      // The root-to-node path as a chain, on a fresh cache.
      std::vector<int32_t> path;
      for (int32_t k = static_cast<int32_t>(j); k >= 0; k = b.tree_parents[k]) {
        path.insert(path.begin(), chunk[k]);
      }
      std::vector<int32_t> seq(prompt.begin(), prompt.end() - 1);
      seq.insert(seq.end(), path.begin(), path.end());
      const std::vector<float> all = PrefillAll(*chain, seq, blocks);
      const std::vector<float> want(all.end() - vocab, all.end());
      const std::vector<float> got(logits.begin() + j * vocab, logits.begin() + (j + 1) * vocab);
      EXPECT_LT(MaxAbsDiff(got, want), 1e-4f) << backend << " node " << j;
    }
    // Keep the path 42 (chunk 2), 42 (chunk 5), 63 (chunk 7): move their K/V
    // to chunk indices 1, 2, 3 (slots of logical indices 11, 12, 13).
    auto slot = [&](int index) { return int64_t{blocks[index / 4]} * 4 + index % 4; };
    ASSERT_TRUE(
        tree->CopyKvSlots({slot(12), slot(15), slot(17)}, {slot(11), slot(12), slot(13)}).ok());
    ForwardBatch next;
    next.block_table_stride = 8;
    next.AddSequence({77}, 14, blocks, tree->block_size(), true);
    ASSERT_TRUE(tree->Forward(next, &logits).ok());
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), {42, 42, 63, 77});
    const std::vector<float> all = PrefillAll(*chain, seq, blocks);
    EXPECT_LT(MaxAbsDiff(logits, std::vector<float>(all.end() - vocab, all.end())), 1e-4f)
        << backend;
  }
}

TEST_P(CpuModelRunnerTest, MalformedTreesAreRejected) {
  auto runner = MakeRunner();
  std::vector<float> logits;
  auto tree_batch = [&](std::vector<int32_t> parents, std::vector<int32_t> depths) {
    ForwardBatch b;
    b.block_table_stride = 2;
    b.AddSequence({5, 6, 7, 8}, 0, Blocks(0, 2), runner->block_size(), true);
    b.tree_parents = std::move(parents);
    for (size_t j = 0; j < depths.size(); ++j) b.positions[j] = depths[j];
    return b;
  };
  ASSERT_TRUE(runner->Forward(tree_batch({-1, 0, 0, 1}, {0, 1, 1, 2}), &logits).ok());
  struct Bad {
    std::vector<int32_t> parents, depths;
    const char* message;
  };
  for (const Bad& bad : {Bad{{-1, 0, 2, 1}, {0, 1, 1, 2}, "tree parent 2"},    // itself
                         Bad{{-1, 0, 3, 1}, {0, 1, 1, 2}, "tree parent 3"},    // a later token
                         Bad{{-1, -2, 0, 1}, {0, 1, 1, 2}, "tree parent -2"},  // below -1
                         Bad{{-1, 0, 0}, {0, 1, 1, 2}, "tree_parents has 3"},
                         Bad{{-1, 0, 0, 1}, {0, 1, 2, 3}, "depth"}}) {
    absl::Status s = runner->Forward(tree_batch(bad.parents, bad.depths), &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad.message));
  }
  // Runners without tree attention refuse tree_parents outright.
  BatchLimits limits{model_->config.vocab_size, model_->config.max_position_embeddings,
                     runner->block_size(), runner->num_kv_blocks()};
  ForwardBatch ok = tree_batch({-1, 0, 0, 1}, {0, 1, 1, 2});
  EXPECT_THAT(std::string(ValidateForwardBatch(ok, limits).message()),
              HasSubstr("no tree attention"));
  limits.tree_attention = true;
  EXPECT_TRUE(ValidateForwardBatch(ok, limits).ok());
  EXPECT_EQ(ValidateForwardBatch(tree_batch({-1, 1, 0, 1}, {0, 1, 1, 2}), limits).code(),
            absl::StatusCode::kInvalidArgument);
  // Slot copies stay inside the cache.
  EXPECT_EQ(runner->CopyKvSlots({0, 1}, {2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->CopyKvSlots({256}, {0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->CopyKvSlots({0}, {-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runner->CopyKvSlots({3}, {2}).ok());
}

// The engine's guarantee that a request's output does not depend on what it
// is batched with (or on chunking and preemption) rests on this: a token's
// logits are bitwise identical whether it is computed alone, in a batch,
// after a chunked prefill or as a decode step. Uses bf16 weights and sizes
// past the SIMD widths so the vector paths run.
void ExpectBitwiseIndependentOfBatchingAndChunking(const TestModelSpec& spec) {
  std::string dir = TempDir();
  ASSERT_TRUE(WriteTestModel(dir, spec).ok());
  auto m = model::LoadModel(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  CpuRunnerOptions o;
  o.block_size = 16;
  o.num_kv_blocks = 64;
  auto r = CpuModelRunner::Create(m->get(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  CpuModelRunner& runner = **r;
  std::mt19937 rng(1);
  std::vector<int32_t> a(70), b(33);
  for (auto& x : a) x = static_cast<int32_t>(rng() % 256);
  for (auto& x : b) x = static_cast<int32_t>(rng() % 256);
  auto blocks = [](int first) {
    std::vector<int32_t> v(8);
    std::iota(v.begin(), v.end(), first);
    return v;
  };
  auto run = [&](ForwardBatch& batch) {
    std::vector<float> logits;
    EXPECT_TRUE(runner.Forward(batch, &logits).ok());
    return logits;
  };
  ForwardBatch alone;
  alone.block_table_stride = 8;
  alone.AddSequence(a, 0, blocks(0), 16, true);
  std::vector<float> want = run(alone);

  ForwardBatch batched;
  batched.block_table_stride = 8;
  batched.AddSequence(b, 0, blocks(8), 16, true);
  batched.AddSequence(a, 0, blocks(16), 16, true);
  std::vector<float> got = run(batched);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 256)) << "batched";

  ForwardBatch first, second;
  first.block_table_stride = second.block_table_stride = 8;
  first.AddSequence(std::vector<int32_t>(a.begin(), a.begin() + 50), 0, blocks(24), 16, false);
  second.AddSequence(std::vector<int32_t>(a.begin() + 50, a.end()), 50, blocks(24), 16, true);
  run(first);
  EXPECT_EQ(run(second), want) << "chunked prefill";

  ForwardBatch prefix, decode;
  prefix.block_table_stride = decode.block_table_stride = 8;
  prefix.AddSequence(std::vector<int32_t>(a.begin(), a.end() - 1), 0, blocks(32), 16, false);
  decode.AddSequence({a.back()}, 69, blocks(32), 16, true);
  run(prefix);
  EXPECT_EQ(run(decode), want) << "decode step";
}

TestModelSpec InvarianceSpec(const std::string& architecture) {
  TestModelSpec spec;
  spec.architecture = architecture;
  spec.hidden = 256;
  spec.intermediate = 512;
  spec.heads = 8;
  spec.kv_heads = 2;
  spec.head_dim = 32;
  spec.dtype = model::DType::kBF16;
  // MoE: experts wide enough for the SIMD paths, grouped GLM routing.
  spec.experts = 16;
  spec.top_k = 4;
  spec.expert_intermediate = 96;
  spec.groups = 4;
  spec.topk_groups = 2;
  return spec;
}

TEST(CpuModelRunnerInvarianceTest, LogitsAreBitwiseIndependentOfBatchingAndChunking) {
  ExpectBitwiseIndependentOfBatchingAndChunking(InvarianceSpec("Qwen3ForCausalLM"));
}

// Tokens grouped by expert run as GEMMs of varying row counts; the same
// guarantee holds because the GEMM's rows do not depend on their count and
// a token's experts are combined in a fixed order.
TEST(CpuModelRunnerInvarianceTest, MoeLogitsAreBitwiseIndependentOfBatchingAndChunking) {
  ExpectBitwiseIndependentOfBatchingAndChunking(InvarianceSpec("Qwen3MoeForCausalLM"));
  ExpectBitwiseIndependentOfBatchingAndChunking(InvarianceSpec("Glm4MoeForCausalLM"));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuModelRunnerTest,
                         ::testing::Values("Qwen3ForCausalLM", "Qwen2ForCausalLM",
                                           "LlamaForCausalLM", "Qwen3MoeForCausalLM",
                                           "Glm4MoeForCausalLM"));

}  // namespace
}  // namespace tessera::runner
