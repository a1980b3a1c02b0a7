// DecodeGraphs: the CUDA graphs a runner replays for decode steps, one per
// (batch bucket, context bucket), and the one eager GEMM-autotuning run per
// batch bucket that comes before its first capture.
//
// A decode step (every sequence one new token, every row wanting logits) is
// padded to a bucket (DecodeBucket): the batch and the context rounded up
// to powers of two. The step's buffers are fixed, so a graph
// captured once replays every later step of its bucket; padded rows write no
// KV (slot -1) and their logits are ignored. Capture cannot time cuBLASLt's
// candidates, so the first step of a batch bucket runs once eagerly with
// tuning on (the GEMM shapes depend on the batch bucket only) and the graph
// then holds the fastest algorithms.
//
// Thread-safety: not thread-safe; owned by one runner.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::kernels::cuda {
class GemmContext;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

// The padded shape of a decode step's graph.
struct DecodeBucket {
  int seqs = 0;     // sequences, rounded up to a power of two (at most max_num_seqs)
  int context = 0;  // longest sequence, up to a power of two >= 256 (at most the positions)
};

// The bucket of a decode step of `seqs` sequences whose longest holds
// `max_seq_len` tokens, for a runner of at most `max_num_seqs` sequences
// and a model of `max_positions` positions.
DecodeBucket DecodeBucketFor(int seqs, int max_seq_len, int max_num_seqs, int64_t max_positions);

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Launches the graph of `bucket` on `stream`. The first time a bucket
  // comes, `step` (which queues the padded step on `stream`) is captured as
  // its graph; before that, when `tune` is non-null and the batch bucket
  // was never tuned, `step` runs once eagerly with `tune`'s autotuning on
  // (the step is idempotent: the graph recomputes the same values). An
  // error leaves no graph for the bucket.
  absl::Status Launch(DecodeBucket bucket, kernels::cuda::GemmContext* tune,
                      kernels::cuda::CudaStream stream, absl::FunctionRef<absl::Status()> step);

  // Drops every graph (they hold pointers to buffers about to be replaced).
  // The caller must have synchronized the stream they ran on.
  void Clear();

  int size() const { return static_cast<int>(graphs_.size()); }
  int autotune_runs() const { return autotune_runs_; }
  // The graph of the last launch, null before the first or after Clear().
  kernels::cuda::CudaGraph* last();

 private:
  using Key = std::pair<int, int>;  // (seqs, context)
  std::map<Key, kernels::cuda::CudaGraph> graphs_;
  Key last_{-1, -1};
  std::set<int> tuned_seqs_;  // batch buckets whose GEMM shapes were tuned
  int autotune_runs_ = 0;
};

}  // namespace tessera::runner
