// Tensor parallelism on CUDA ranks (skipped without two GPUs): TP=2 over
// NCCL, and over the peer-to-peer all-reduce where the GPUs have peer
// access, reproduces TP=1's logits within the bf16 tolerance and transformers'
// greedy continuations of the trained model pair, eager and with CUDA
// graphs; token trees (a tree step, CopyKvSlots, a decode step) match TP=1;
// sampling on the GPUs draws what the host sampler draws; ranks that fell
// out of step stop the group instead of giving wrong logits; and a rank
// per GPU is enforced.
//
// Tolerance: as worker/runner/cuda/cuda_model_runner_test.cc — logits max error
// <= 0.04 x max(1, max |reference|) against TP=1; greedy tokens compared up
// to the first fixture step whose top-1/top-2 margin is below 0.25.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/device_query.h"
#include "kernels/cuda_devices.h"
#include "nlohmann/json.hpp"
#include "worker/parallel/cuda_tensor_parallel_runner.h"
#include "worker/sampling/sampler.h"

namespace tessera::parallel {
namespace {

std::string SourcePath(const std::string& rel) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/", rel);
}

runner::CudaRunnerOptions Options(bool graphs) {
  runner::CudaRunnerOptions o;
  o.num_kv_blocks = 64;
  o.max_num_tokens = 512;
  o.max_num_seqs = 8;
  o.cuda_graphs = graphs;
  return o;
}

TEST(CudaTensorParallelTest, TwoRanksMatchOneRankAndTransformers) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices; " << found.devices.size();
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  std::ifstream in(SourcePath("models/fixtures/target_expected.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json expected = nlohmann::json::parse(ss.str());
  const int64_t vocab = (*model)->config.vocab_size;
  const bool peers =
      kernels::cuda::AllPeersAccessible({found.devices[0].ordinal, found.devices[1].ordinal});
  for (const std::string backend : {"nccl", "p2p"}) {
    if (backend == "p2p" && !peers) continue;
    for (bool graphs : {false, true}) {
      SCOPED_TRACE(absl::StrCat(backend, graphs ? " graphs" : " eager"));
      auto one = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                                  {found.devices[0]}, Options(graphs));
      ASSERT_TRUE(one.ok()) << one.status();
      runner::CudaRunnerOptions two_options = Options(graphs);
      two_options.all_reduce_backend = backend;
      auto two = CudaTensorParallelRunner::Create(
          model->get(), (*model)->config, {found.devices[0], found.devices[1]}, two_options);
      ASSERT_TRUE(two.ok()) << two.status();
      std::vector<int32_t> blocks(16);
      std::iota(blocks.begin(), blocks.end(), 0);
      size_t compared = 0;
      for (const nlohmann::json& c : expected["cases"]) {
        const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
        runner::ForwardBatch batch;
        batch.block_table_stride = 16;
        batch.AddSequence(prompt, 0, blocks, 16, true);
        std::vector<float> a, b;
        ASSERT_TRUE((*one)->Forward(batch, &a).ok());
        ASSERT_TRUE((*two)->Forward(batch, &b).ok());
        ASSERT_EQ(a.size(), b.size());
        float scale = 1, err = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          scale = std::max(scale, std::abs(a[i]));
          err = std::max(err, std::abs(a[i] - b[i]));
        }
        EXPECT_LE(err, 0.04f * scale) << "TP=2 vs TP=1 max abs error " << err;
        const std::vector<int32_t> want = c["greedy_ids"].get<std::vector<int32_t>>();
        const std::vector<float> margins = c["greedy_top2_margins"].get<std::vector<float>>();
        int32_t pos = static_cast<int32_t>(prompt.size());
        for (size_t step = 0; step < want.size() && margins[step] >= 0.25f; ++step) {
          int32_t next = 0;
          kernels::cpu::reference::Argmax(b.data(), 1, vocab, &next);
          ASSERT_EQ(next, want[step]) << "step " << step;
          ++compared;
          runner::ForwardBatch d;
          d.block_table_stride = 16;
          d.AddSequence({want[step]}, pos++, blocks, 16, true);
          ASSERT_TRUE((*two)->Forward(d, &b).ok());
        }
      }
      EXPECT_GE(compared, 3u);
    }
  }
}

// Token trees on two ranks: a tree batch, CopyKvSlots of one path and a
// decode step give TP=1's logits within the tolerance (each rank masks its
// own heads and copies its own cache slots).
TEST(CudaTensorParallelTest, TwoRanksVerifyTreesLikeOneRank) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices; " << found.devices.size();
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto one = CudaTensorParallelRunner::Create(model->get(), (*model)->config, {found.devices[0]},
                                              Options(true));
  ASSERT_TRUE(one.ok()) << one.status();
  auto two = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                              {found.devices[0], found.devices[1]}, Options(true));
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE((*two)->SupportsTreeAttention());
  const std::vector<int32_t> blocks = {5, 2, 7, 1};
  auto expect_close = [](const std::vector<float>& a, const std::vector<float>& b,
                         const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    float scale = 1, err = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      scale = std::max(scale, std::abs(a[i]));
      err = std::max(err, std::abs(a[i] - b[i]));
    }
    EXPECT_LE(err, 0.04f * scale) << what << ": TP=2 vs TP=1 max abs error " << err;
  };
  std::vector<int32_t> prompt(30);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + 13 * i) % 4000;
  runner::ForwardBatch pre;
  pre.block_table_stride = 4;
  pre.AddSequence(prompt, 0, blocks, 16, false);
  // Chunk: a root token and 6 nodes; parents give depths 0 1 1 2 2 3 3.
  const std::vector<int32_t> chunk = {11, 42, 99, 5, 42, 7, 63};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 4, 3};
  const std::vector<int32_t> depth = {0, 1, 1, 2, 2, 3, 3};
  runner::ForwardBatch tree;
  tree.block_table_stride = 4;
  tree.AddSequence(chunk, 30, blocks, 16, false);
  tree.tree_parents = parents;
  for (size_t j = 0; j < chunk.size(); ++j) {
    tree.positions[j] = 30 + depth[j];
    tree.logits_indices.push_back(static_cast<int32_t>(j));
  }
  // Keep the path 0 -> 2 -> 4 -> 5: chunk 2 to index 31, 4 to 32, 5 to 33.
  auto slot = [&](int index) { return int64_t{blocks[index / 16]} * 16 + index % 16; };
  runner::ForwardBatch next;
  next.block_table_stride = 4;
  next.AddSequence({77}, 34, blocks, 16, true);
  std::vector<float> a, b;
  for (auto* r : {&*one, &*two}) ASSERT_TRUE((*r)->Forward(pre, &a).ok());
  ASSERT_TRUE((*one)->Forward(tree, &a).ok());
  ASSERT_TRUE((*two)->Forward(tree, &b).ok());
  expect_close(a, b, "tree logits");
  for (auto* r : {&*one, &*two}) {
    ASSERT_TRUE(
        (*r)->CopyKvSlots({slot(32), slot(34), slot(35)}, {slot(31), slot(32), slot(33)}).ok());
  }
  EXPECT_EQ((*two)->CopyKvSlots({slot(32)}, {64 * 16}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*one)->Forward(next, &a).ok());
  ASSERT_TRUE((*two)->Forward(next, &b).ok());
  expect_close(a, b, "decode after CopyKvSlots");
}

// ForwardSample on two ranks (each rank's logits slice copied to rank 0,
// sampled there) draws the tokens the host sampler draws from the logits
// Forward returns for the same batch: greedy, temperature, top-k, top-p and
// min-p rows, a prefill step of three sequences and a decode step (a
// graph); rows that do not match the batch, and a malformed batch, are
// refused, and the group samples correctly afterwards.
TEST(CudaTensorParallelTest, TwoRanksSampleOnTheDeviceAsTheHostSamplerDoes) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices; " << found.devices.size();
  auto model = model::LoadModel(SourcePath("models/target"));
  ASSERT_TRUE(model.ok()) << model.status();
  const bool peers =
      kernels::cuda::AllPeersAccessible({found.devices[0].ordinal, found.devices[1].ordinal});
  runner::CudaRunnerOptions o = Options(true);
  o.all_reduce_backend = peers ? "p2p" : "nccl";
  auto two = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                              {found.devices[0], found.devices[1]}, o);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE((*two)->SupportsDeviceSampling());
  const int64_t vocab = (*model)->config.vocab_size;
  const std::vector<runner::DeviceSamplingRow> kinds = {
      {0.0f, 0, 1.0f, 0.0f, 1, 0},  {0.8f, 50, 1.0f, 0.0f, 2, 0},  {1.0f, 0, 0.9f, 0.0f, 3, 0},
      {1.2f, 0, 1.0f, 0.05f, 4, 0}, {0.7f, 20, 0.8f, 0.02f, 5, 0}, {1.0f, 0, 1.0f, 0.0f, 6, 0}};
  auto check = [&](const runner::ForwardBatch& batch, const std::string& what) {
    SCOPED_TRACE(what);
    const size_t rows = batch.logits_indices.size();
    std::vector<runner::DeviceSamplingRow> params(rows);
    for (size_t i = 0; i < rows; ++i) {
      params[i] = kinds[i % kinds.size()];
      params[i].position = batch.positions[batch.logits_indices[i]] + 1;
    }
    std::vector<float> logits;
    ASSERT_TRUE((*two)->Forward(batch, &logits).ok());
    std::vector<int32_t> tokens;
    const absl::Status s = (*two)->ForwardSample(batch, params, &tokens);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(tokens.size(), rows);
    for (size_t i = 0; i < rows; ++i) {
      const runner::DeviceSamplingRow& d = params[i];
      sampling::SamplingParams p{d.temperature, d.top_k, d.top_p, d.min_p};
      p.seed = d.seed;
      absl::StatusOr<sampling::SampleResult> want =
          sampling::Sample(absl::MakeConstSpan(logits.data() + i * vocab, vocab), p,
                           sampling::TokenCounts{}, params[i].position);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(tokens[i], want->token) << "row " << i;
    }
  };
  runner::ForwardBatch pre;
  pre.block_table_stride = 4;
  std::vector<std::vector<int32_t>> tables = {{0, 1}, {2, 3}, {4, 5}};
  for (int q = 0; q < 3; ++q) {
    std::vector<int32_t> prompt(9 + 5 * q);
    for (size_t i = 0; i < prompt.size(); ++i) {
      prompt[i] = static_cast<int32_t>((31 * q + 7 * i + 3) % vocab);
    }
    pre.AddSequence(prompt, 0, tables[q], 16, true);
  }
  check(pre, "prefill");
  runner::ForwardBatch step;
  step.block_table_stride = 4;
  for (int q = 0; q < 3; ++q) step.AddSequence({42 + q}, 9 + 5 * q, tables[q], 16, true);
  check(step, "decode");
  // One row: rank 0 draws none, rank 1 the row (copying rank 0's slice).
  runner::ForwardBatch one;
  one.block_table_stride = 4;
  one.AddSequence({42}, 9, tables[0], 16, true);
  check(one, "decode of one sequence");
  std::vector<int32_t> tokens;
  EXPECT_EQ((*two)->ForwardSample(step, std::vector<runner::DeviceSamplingRow>(2), &tokens).code(),
            absl::StatusCode::kInvalidArgument);
  // A malformed batch (a token outside the vocabulary) is refused by every
  // rank before any collective, and the group keeps sampling afterwards.
  runner::ForwardBatch bad;
  bad.block_table_stride = 4;
  for (int q = 0; q < 3; ++q) {
    bad.AddSequence({q == 1 ? static_cast<int32_t>(vocab) : 42 + q}, 9 + 5 * q, tables[q], 16,
                    true);
  }
  EXPECT_EQ((*two)->ForwardSample(bad, std::vector<runner::DeviceSamplingRow>(3), &tokens).code(),
            absl::StatusCode::kInvalidArgument);
  check(step, "decode after a refused batch");
}

// Ranks out of step (rank 0 one p2p all-reduce call ahead of rank 1, as an
// asymmetric failure would leave them): the next step's all-reduces give up
// waiting for their peers, the step fails with FAILED_PRECONDITION instead
// of returning wrong logits, Health() reports it, and every later step is
// refused at once without running.
TEST(CudaTensorParallelTest, RanksOutOfStepBreakTheGroupForGood) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices; " << found.devices.size();
  if (!kernels::cuda::AllPeersAccessible({found.devices[0].ordinal, found.devices[1].ordinal})) {
    GTEST_SKIP() << "the p2p all-reduce needs peer access";
  }
  auto model = model::LoadModel(SourcePath("models/draft"));
  ASSERT_TRUE(model.ok()) << model.status();
  runner::CudaRunnerOptions o = Options(true);
  o.all_reduce_backend = "p2p";
  auto two = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                              {found.devices[0], found.devices[1]}, o);
  ASSERT_TRUE(two.ok()) << two.status();
  runner::ForwardBatch pre;
  pre.block_table_stride = 2;
  pre.AddSequence({5, 17, 29, 41, 53}, 0, {0, 1}, 16, true);
  std::vector<float> logits;
  ASSERT_TRUE((*two)->Forward(pre, &logits).ok());
  EXPECT_TRUE((*two)->Health().ok());
  // An extra call on rank 0 alone (it gives up after about 2 s).
  ASSERT_TRUE((*two)->DesyncAllReduceForTest(0).ok());
  runner::ForwardBatch step;
  step.block_table_stride = 2;
  step.AddSequence({61}, 5, {0, 1}, 16, true);
  const absl::Status s = (*two)->Forward(step, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("out of step"), std::string::npos) << s;
  EXPECT_EQ((*two)->Health().code(), absl::StatusCode::kFailedPrecondition);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ((*two)->Forward(step, &logits).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> tokens;
  EXPECT_EQ((*two)->ForwardSample(step, std::vector<runner::DeviceSamplingRow>(1), &tokens).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*two)->ForwardGreedy(step, &tokens).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST(CudaTensorParallelTest, UnknownAllReduceBackendIsAnError) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.size() < 2) GTEST_SKIP() << "needs two CUDA devices; " << found.devices.size();
  auto model = model::LoadModel(SourcePath("models/draft"));
  ASSERT_TRUE(model.ok()) << model.status();
  runner::CudaRunnerOptions o = Options(false);
  o.all_reduce_backend = "cpu";
  auto tp = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                             {found.devices[0], found.devices[1]}, o);
  ASSERT_FALSE(tp.ok());
  EXPECT_NE(tp.status().message().find("nccl or p2p"), absl::string_view::npos) << tp.status();
}

TEST(CudaTensorParallelTest, EachRankNeedsItsOwnGpu) {
  kernels::DetectedCudaDevices found = kernels::DetectCudaDevices();
  if (found.devices.empty()) GTEST_SKIP() << "no CUDA device: " << found.note;
  auto model = model::LoadModel(SourcePath("models/draft"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto tp = CudaTensorParallelRunner::Create(model->get(), (*model)->config,
                                             {found.devices[0], found.devices[0]}, Options(false));
  ASSERT_FALSE(tp.ok());
  EXPECT_EQ(tp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tp.status().message().find("named twice"), absl::string_view::npos) << tp.status();
}

}  // namespace
}  // namespace tessera::parallel
