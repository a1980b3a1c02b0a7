#include "worker/runner/cuda/decode_graphs.h"

#include <algorithm>

#include "base/status_macros.h"
#include "kernels/cuda/gemm.h"

namespace tessera::runner {
namespace {

// Smallest power of two >= n (n >= 1).
int64_t RoundUpPow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

DecodeBucket DecodeBucketFor(int seqs, int max_seq_len, int max_num_seqs, int64_t max_positions) {
  DecodeBucket b;
  b.seqs = static_cast<int>(std::min<int64_t>(RoundUpPow2(seqs), max_num_seqs));
  b.context = static_cast<int>(
      std::min<int64_t>(std::max<int64_t>(256, RoundUpPow2(max_seq_len)), max_positions));
  return b;
}

absl::Status DecodeGraphs::Launch(DecodeBucket bucket, kernels::cuda::GemmContext* tune,
                                  kernels::cuda::CudaStream stream,
                                  absl::FunctionRef<absl::Status()> step) {
  const Key key{bucket.seqs, bucket.context};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (tune != nullptr && tuned_seqs_.insert(bucket.seqs).second) {
      // Capture cannot time cuBLASLt's candidates: tune on an eager run.
      tune->SetAutotune(bucket.seqs);
      ++autotune_runs_;
      absl::Status tuned = step();
      tune->SetAutotune(0);
      if (!tuned.ok()) {
        tuned_seqs_.erase(bucket.seqs);
        return tuned;
      }
    }
    kernels::cuda::CudaGraph graph;
    RETURN_IF_ERROR(graph.BeginCapture(stream));
    absl::Status run = step();
    absl::Status end = graph.EndCapture();
    if (!run.ok()) return run;
    if (!end.ok()) return end;
    it = graphs_.emplace(key, std::move(graph)).first;
  }
  last_ = key;
  return it->second.Launch(stream);
}

void DecodeGraphs::Clear() {
  graphs_.clear();
  last_ = {-1, -1};
}

kernels::cuda::CudaGraph* DecodeGraphs::last() {
  auto it = graphs_.find(last_);
  return it == graphs_.end() ? nullptr : &it->second;
}

}  // namespace tessera::runner
