// A draft source that runs a small model of the target's tokenizer through
// the same runner code as the target (runner::ModelRunner, e.g.
// CpuModelRunner) with its own paged KV cache (draft_kv_cache.h: no prefix
// caching, no sharing). Proposals of all queried sequences are computed together:
// each round is one batched forward pass (the first catches each sequence's
// KV up with its new tokens, the others add one draft token each).
//
// Drafted tokens stay in the KV cache as if accepted (run-ahead); Update
// truncates the KV to the prefix the new tokens agree with.
//
// Sampling: a greedy target gets greedy, one-hot drafts. Otherwise the draft
// samples with the target's temperature, top-k/top-p/min-p (no penalties),
// further truncated to `max_q_support` tokens, from a Philox stream keyed by
// (seed ^ kDraftSeedMix, position); q is that exact distribution, so the
// verifier stays lossless. With ModelSourceOptions::tree the proposal is
// the chain plus sibling leaves at its first positions.
//
// Thread-safety: not thread-safe (draft_source.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/weights.h"
#include "worker/runner/model_runner.h"
#include "worker/spec/draft_source.h"

namespace tessera::spec {

inline constexpr uint64_t kDraftSeedMix = 0x5DEECE66DULL;

struct ModelSourceOptions {
  int max_model_len = 4096;
  int max_q_support = 64;  // top-k applied to the draft's sampling distribution
  // Trees: the first tree.branch_depth positions get up to
  // tree.max_branching - 1 siblings each, the draft's next most likely
  // tokens there (greedy: by logit; sampled: by probability), as leaves
  // listed after the chain, whose length shrinks to keep the node count;
  // siblings take at most a third of the queried nodes (none below 3).
  // Siblings carry the distribution of their position as q (they were not
  // drawn from it: tree verification does not use q, and the first-child
  // chain holds only drawn tokens). Not with device sampling (the runner
  // returns only the argmax).
  TreeOptions tree;
};

// Takes a runner (which must outlive nothing else: the source owns it).
absl::StatusOr<std::unique_ptr<DraftSource>> MakeModelSource(
    std::unique_ptr<runner::ModelRunner> runner, ModelSourceOptions options = {});

struct ModelSourceFromDirOptions {
  ModelSourceOptions source;
  int block_size = 16;
  int64_t num_kv_blocks = 1024;
  int num_threads = 0;  // 0 = the default pool
  // Where the draft model runs: "cpu", or a CUDA selector ("cuda",
  // "cuda:<PCI bus id>") in a build with the CUDA backend.
  std::string device = "cpu";
};

// Loads the model in `dir` and runs it on the CPU kernels, or on the GPU
// named by options.device.
absl::StatusOr<std::unique_ptr<DraftSource>> MakeModelSourceFromDir(
    const std::string& dir, ModelSourceFromDirOptions options = {});

}  // namespace tessera::spec
