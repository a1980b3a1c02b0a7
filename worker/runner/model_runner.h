// ModelRunner: runs a decoder model's forward pass over a ForwardBatch,
// owning the paged KV cache. The engine's step calls Forward() (or
// ForwardSample()) once; the backends (CPU, CUDA, simulated) implement it.
// A runner whose device works asynchronously may also take steps as a
// submit/collect pair (SubmitSample, CollectSample), so that the engine
// prepares step N+1 while step N runs.
//
// Thread-safety: not thread-safe; the engine loop owns its runner.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/model/config.h"
#include "worker/runner/forward_batch.h"

namespace tessera::runner {

// One logits row's sampling, for runners that sample where the logits are
// (ForwardSample): the meaning of worker/sampling's SamplingParams without
// penalties (those need the sequence's token counts, kept on the host).
struct DeviceSamplingRow {
  float temperature = 1.0f;  // below 1e-5: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int64_t position = 0;  // index of the token being drawn in its sequence
};

// A token of a submitted step whose id is not known on the host yet: the one
// drawn for logits row `row` of the step submitted just before it
// (SubmitSample). The batch's token_ids[token_index] is a placeholder (any
// id in the vocabulary) that the runner replaces on its device.
struct PreviousStepToken {
  int32_t token_index = 0;  // into ForwardBatch::token_ids
  int32_t row = 0;          // into the previous step's drawn tokens
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const model::ModelConfig& config() const = 0;
  virtual int block_size() const = 0;
  virtual int64_t num_kv_blocks() const = 0;

  // Writes the batch's K/V into the cache and returns the logits of
  // batch.logits_indices' tokens, [logits_indices.size(), vocab_size],
  // row-major, into `logits` (resized). INVALID_ARGUMENT, with nothing
  // computed, for a malformed batch (token id outside the vocabulary,
  // position beyond the context, slot or block outside the cache, ...).
  virtual absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) = 0;

  // Whether Forward accepts ForwardBatch::tree_parents (token trees: each
  // token attends to the cached context and its ancestors only) and
  // CopyKvSlots is available. Runners without it get chains only (the
  // engine keeps the first-child chain of a proposed tree).
  virtual bool SupportsTreeAttention() const { return false; }

  // Copies the K/V of slot from[i] to slot to[i] in every layer, in order
  // (i = 0, 1, ...): after a tree verification the accepted nodes' K/V move
  // to the contiguous slots after the committed tokens. INVALID_ARGUMENT,
  // copying nothing, when the spans differ in length or a slot is outside
  // the cache; UNIMPLEMENTED where SupportsTreeAttention() is false.
  virtual absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) {
    return absl::UnimplementedError("this runner has no tree attention");
  }

  // Whether ForwardSample is available.
  virtual bool SupportsDeviceSampling() const { return false; }

  // Forward, then one token per logits row drawn where the logits live (on
  // the GPU: no logits cross to the host), with exactly the draw the host
  // sampler (worker/sampling) makes for the same logits. tokens[i] is row i's
  // token, or -1 when the row cannot be sampled (non-finite logits).
  virtual absl::Status ForwardSample(const ForwardBatch& batch,
                                     absl::Span<const DeviceSamplingRow> rows,
                                     std::vector<int32_t>* tokens) {
    return absl::UnimplementedError("this runner samples on the host only");
  }

  // Whether SubmitSample / CollectSample are available (and
  // SupportsDeviceSampling() is true).
  virtual bool SupportsAsyncSampling() const { return false; }

  // ForwardSample split in two, for an engine that overlaps its host work
  // with the device. SubmitSample validates and stages the batch and queues
  // its work (the forward pass, then the draws) without waiting for it; the
  // caller may change or free `batch` and `rows` when it returns. Tokens in
  // `from_previous` take the ids drawn by the step submitted just before
  // (which may still be running; the device orders the two). CollectSample
  // waits for the oldest submitted step not yet collected and returns its
  // tokens, as ForwardSample would. At most two steps are submitted and not
  // collected at once. ForwardSample(b, rows, t) is SubmitSample(b, rows, {})
  // then CollectSample(t). A failed SubmitSample queues nothing (nothing to
  // collect); INVALID_ARGUMENT for a `from_previous` entry outside the batch
  // or the previous step's rows, or with no previous step.
  virtual absl::Status SubmitSample(const ForwardBatch& batch,
                                    absl::Span<const DeviceSamplingRow> rows,
                                    absl::Span<const PreviousStepToken> from_previous) {
    return absl::UnimplementedError("this runner has no asynchronous steps");
  }
  virtual absl::Status CollectSample(std::vector<int32_t>* tokens) {
    return absl::UnimplementedError("this runner has no asynchronous steps");
  }

  // OK while the runner can run steps; otherwise why not, for good (a
  // tensor-parallel group whose ranks fell out of step): every later step
  // fails with it, and the worker stops taking work. Any thread.
  virtual absl::Status Health() const { return absl::OkStatus(); }
};

}  // namespace tessera::runner
