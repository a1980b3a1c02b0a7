#include "tests/bench/cuda_runner_bench_peer.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_buffer.h"

namespace tessera::bench {

namespace kcu = ::tessera::kernels::cuda;

absl::StatusOr<double> CudaRunnerBenchPeer::ReplayLastDecodeGraphMs(runner::CudaModelRunner& runner,
                                                                    int replays,
                                                                    int64_t argmax_rows) {
  kcu::CudaGraph* graph = runner.graphs_.last();
  if (graph == nullptr) {
    return absl::FailedPreconditionError("no decode step has run as a CUDA graph yet");
  }
  const runner::LogitsSlice logits = runner.device_logits();
  if (replays < 1 || argmax_rows < 0 || argmax_rows > runner.sampler_.max_rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReplayLastDecodeGraphMs: replays ", replays, ", argmax rows ", argmax_rows));
  }
  const kcu::CudaStream stream = runner.stream();
  ASSIGN_OR_RETURN(kcu::Event start, kcu::Event::Create());
  ASSIGN_OR_RETURN(kcu::Event stop, kcu::Event::Create());
  RETURN_IF_ERROR(kcu::Synchronize(stream));
  RETURN_IF_ERROR(start.Record(stream));
  for (int i = 0; i < replays; ++i) {
    RETURN_IF_ERROR(graph->Launch(stream));
    if (argmax_rows > 0) {
      RETURN_IF_ERROR(runner.sampler_.QueueArgmax(logits.data, argmax_rows, logits.cols, stream));
    }
  }
  RETURN_IF_ERROR(stop.Record(stream));
  RETURN_IF_ERROR(stop.Synchronize());
  ASSIGN_OR_RETURN(const float ms, kcu::Event::ElapsedMs(start, stop));
  return static_cast<double>(ms) / replays;
}

absl::StatusOr<double> CudaRunnerBenchPeer::ReplayLastDecodeGraphMs(
    parallel::CudaTensorParallelRunner& tp, int replays) {
  if (replays < 1) return absl::InvalidArgumentError("ReplayLastDecodeGraphMs: replays < 1");
  const int n = tp.size();
  std::vector<absl::StatusOr<double>> ms(n, absl::UnknownError("not run"));
  // Every rank's stream is idle before any starts timing, so no rank's
  // first all-reduce waits for a peer still finishing its last step.
  absl::Barrier* idle = new absl::Barrier(n);
  auto replay_rank = [&](int r) {
    runner::CudaModelRunner& rank = *tp.ranks_[r];
    absl::Status ready = kcu::SetDevice(rank.device_logits().ordinal);
    if (ready.ok()) ready = rank.Synchronize();
    if (idle->Block()) delete idle;
    ms[r] = ready.ok() ? ReplayLastDecodeGraphMs(rank, replays, 0) : absl::StatusOr<double>(ready);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(replay_rank, r);
  for (std::thread& t : threads) t.join();
  double slowest = 0;
  for (int r = 0; r < n; ++r) {
    if (!ms[r].ok()) {
      return absl::Status(ms[r].status().code(),
                          absl::StrCat("rank ", r, ": ", ms[r].status().message()));
    }
    slowest = std::max(slowest, *ms[r]);
  }
  return slowest;
}

}  // namespace tessera::bench
