// ModelRunner: runs a decoder model's forward pass over a ForwardBatch,
// owning the paged KV cache. The engine's step calls Forward() once; the
// backends (CPU now, CUDA later) implement it.
//
// Thread-safety: not thread-safe; the engine loop owns its runner.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/config.h"
#include "worker/runner/forward_batch.h"

namespace tessera::runner {

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
};

}  // namespace tessera::runner
