// DeviceSampler: what a CUDA runner does with a step's logits while they
// are still on the GPU, so that only token ids (or one value per row) reach
// the host: greedy argmax, each row's best (value, id) over a vocabulary
// slice, and drawing tokens with per-row sampling parameters
// (kernels/cuda/sampling.h), also over logits slices that several
// tensor-parallel ranks hold (gathered peer to peer first).
//
// Its buffers are sized once for the runner's largest number of logits
// rows; the sampler's weights and the gathered slices are allocated on the
// first step that needs them (greedy-only serving never does) and grown to
// the largest step seen.
//
// Thread-safety: not thread-safe; owned by one runner and used on its
// stream and device.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/pinned_buffer.h"
#include "worker/runner/model_runner.h"

namespace tessera::runner {

// One rank's logits rows on its device (CudaModelRunner::device_logits).
struct LogitsSlice {
  const float* data = nullptr;  // [rows, cols] fp32
  int64_t start = 0;            // first vocabulary column
  int64_t cols = 0;
  int ordinal = 0;                              // the device holding it
  const kernels::cuda::Event* ready = nullptr;  // recorded after the rows (null: already)
};

class DeviceSampler {
 public:
  // Buffers for up to `max_rows` logits rows.
  absl::Status Allocate(int64_t max_rows);
  int64_t max_rows() const { return max_rows_; }

  // Queues the argmax of each of the `r` [vocab] rows at `logits` into the
  // device's id buffer (ties: lowest id); INVALID_ARGUMENT for more than
  // max_rows() rows.
  absl::Status QueueArgmax(const float* logits, int64_t r, int64_t vocab,
                           kernels::cuda::CudaStream stream);
  // QueueArgmax, then the ids copied into *tokens (resized to r); the copy
  // is complete once `stream` is synchronized.
  absl::Status Greedy(const float* logits, int64_t r, int64_t vocab, std::vector<int32_t>* tokens,
                      kernels::cuda::CudaStream stream);
  // Each row's maximum and the id holding it (ids offset by `first_id`, the
  // slice's first vocabulary column), copied into *ids and *values; complete
  // once `stream` is synchronized.
  absl::Status TopOne(const float* logits, int64_t r, int64_t vocab, int64_t first_id,
                      std::vector<int32_t>* ids, std::vector<float>* values,
                      kernels::cuda::CudaStream stream);
  // Queues the draw of one token per row of the [r, vocab] logits with
  // `rows`' parameters into the device's id buffer (drawn_ids()), without
  // waiting: the parameters go up from pinned memory (double-buffered, so
  // the next step's may be staged while this copy is queued). The first
  // step that needs more sampling scratch synchronizes `stream` to grow it.
  // INVALID_ARGUMENT for more than max_rows() rows or rows.size() != r.
  absl::Status QueueSample(const float* logits, int64_t r, int64_t vocab,
                           absl::Span<const DeviceSamplingRow> rows,
                           kernels::cuda::CudaStream stream);
  // The device's ids of the last QueueArgmax / QueueSample / Greedy /
  // TopOne / Sample, valid in stream order until the next of them.
  const int32_t* drawn_ids() const { return ids_.as<int32_t>(); }
  // QueueSample, then the ids copied into *tokens; `stream` is synchronized
  // when it returns, also for r = 0.
  absl::Status Sample(const float* logits, int64_t r, int64_t vocab,
                      absl::Span<const DeviceSamplingRow> rows, std::vector<int32_t>* tokens,
                      kernels::cuda::CudaStream stream);
  // Sample over `slices` (in vocabulary order, together [0, vocab)), on
  // device `ordinal` (current): a single slice there is sampled in place;
  // otherwise the slices' r rows are copied side by side (a peer's once its
  // `ready` event has fired, waited for on the GPU). INVALID_ARGUMENT for
  // slices that do not tile the vocabulary or more rows than Allocate took.
  absl::Status SampleSlices(absl::Span<const LogitsSlice> slices, int64_t r, int64_t vocab,
                            int ordinal, absl::Span<const DeviceSamplingRow> rows,
                            std::vector<int32_t>* tokens, kernels::cuda::CudaStream stream);

 private:
  absl::Status CheckSlices(absl::Span<const LogitsSlice> slices, int64_t r, int64_t vocab,
                           size_t num_rows) const;

  int64_t max_rows_ = 0;
  kernels::cuda::DeviceBuffer ids_;               // int32 per row: argmax, top-one or drawn ids
  kernels::cuda::DeviceBuffer top_values_;        // float per row (TopOne)
  kernels::cuda::DeviceBuffer top_workspace_;     // TopOneRows' scratch
  kernels::cuda::DeviceBuffer params_;            // kernels::cuda::RowSamplingParams per row
  kernels::cuda::PinnedStaging params_staging_;   // the host side of params_
  kernels::cuda::DeviceBuffer sample_workspace_;  // SampleRows' weights (first sampled step)
  // Every rank's slice side by side, [rows, vocab] (SampleSlices across
  // devices; the first such step, grown as needed).
  kernels::cuda::DeviceBuffer gathered_;
};

}  // namespace tessera::runner
