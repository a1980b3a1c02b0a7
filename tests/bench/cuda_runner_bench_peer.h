// CudaRunnerBenchPeer: what the GPU benchmarks measure inside the CUDA
// runners that serving never needs: the device time of a decode step alone,
// by replaying its captured graph back to back. A friend of
// runner::CudaModelRunner and parallel::CudaTensorParallelRunner, so the
// runners carry no benchmark-only API.
//
// Thread-safety: call it from the thread that owns the runner, between
// steps (no step may be in flight).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/parallel/cuda_tensor_parallel_runner.h"
#include "worker/runner/cuda/cuda_model_runner.h"

namespace tessera::bench {

class CudaRunnerBenchPeer {
 public:
  // Replays the graph of `runner`'s last graph-run decode step `replays`
  // times back to back (each followed by an argmax over `argmax_rows`
  // logits rows when > 0, as ForwardGreedy does) and returns the GPU
  // milliseconds per replay between two events: the step's device time
  // without the host's work. The replays rewrite the same KV slots with the
  // same values. FAILED_PRECONDITION when no step ran as a graph.
  static absl::StatusOr<double> ReplayLastDecodeGraphMs(runner::CudaModelRunner& runner,
                                                        int replays, int64_t argmax_rows);

  // Every rank of `tp` replays its last decode graph `replays` times at once
  // (one thread per rank, so the ranks' all-reduces pair up as in a step),
  // with no argmax; returns the slowest rank's ms per replay. A step's wall
  // time minus this is the host's share of it.
  static absl::StatusOr<double> ReplayLastDecodeGraphMs(parallel::CudaTensorParallelRunner& tp,
                                                        int replays);
};

}  // namespace tessera::bench
