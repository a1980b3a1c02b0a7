#include "worker/runner/cuda/device_sampling.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/logits.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/top_one.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;

// Grows `buffer` to at least `bytes`: scratch that only some steps need,
// allocated when the first such step comes. The old buffer goes only once
// `stream` has finished with it.
absl::Status GrowScratch(kcu::DeviceBuffer* buffer, size_t bytes, std::string_view what,
                         kcu::CudaStream stream) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  RETURN_IF_ERROR(kcu::Synchronize(stream));
  *buffer = kcu::DeviceBuffer();
  ASSIGN_OR_RETURN(*buffer, AllocateDevice(bytes, what));
  return absl::OkStatus();
}

kcu::RowSamplingParams ToKernelParams(const DeviceSamplingRow& row) {
  kcu::RowSamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.seed = row.seed;
  p.position = row.position;
  return p;
}

}  // namespace

absl::Status DeviceSampler::Allocate(int64_t max_rows) {
  max_rows_ = max_rows;
  ASSIGN_OR_RETURN(ids_, AllocateDevice(max_rows * sizeof(int32_t), "argmax"));
  ASSIGN_OR_RETURN(top_values_, AllocateDevice(max_rows * sizeof(float), "argmax values"));
  ASSIGN_OR_RETURN(top_workspace_,
                   AllocateDevice(kcu::TopOneWorkspaceBytes(max_rows), "argmax workspace"));
  ASSIGN_OR_RETURN(params_,
                   AllocateDevice(max_rows * sizeof(kcu::RowSamplingParams), "sampling params"));
  ASSIGN_OR_RETURN(params_staging_, kcu::PinnedStaging::Create(std::max<size_t>(
                                        1, max_rows * sizeof(kcu::RowSamplingParams))));
  return absl::OkStatus();
}

absl::Status DeviceSampler::QueueArgmax(const float* logits, int64_t r, int64_t vocab,
                                        kcu::CudaStream stream) {
  if (r < 0 || r > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("argmax over ", r, " rows; the buffers hold ", max_rows_));
  }
  return kcu::ArgmaxRows(logits, r, vocab, ids_.as<int32_t>(), stream);
}

absl::Status DeviceSampler::Greedy(const float* logits, int64_t r, int64_t vocab,
                                   std::vector<int32_t>* tokens, kcu::CudaStream stream) {
  tokens->resize(static_cast<size_t>(r));
  if (r == 0) return absl::OkStatus();
  RETURN_IF_ERROR(QueueArgmax(logits, r, vocab, stream));
  return kcu::CopyToHost(tokens->data(), ids_.data(), r * sizeof(int32_t), stream);
}

absl::Status DeviceSampler::TopOne(const float* logits, int64_t r, int64_t vocab, int64_t first_id,
                                   std::vector<int32_t>* ids, std::vector<float>* values,
                                   kcu::CudaStream stream) {
  ids->resize(static_cast<size_t>(r));
  values->resize(static_cast<size_t>(r));
  if (r == 0) return absl::OkStatus();
  RETURN_IF_ERROR(kcu::TopOneRows(logits, r, vocab, first_id, ids_.as<int32_t>(),
                                  top_values_.as<float>(), top_workspace_.data(),
                                  top_workspace_.size(), stream));
  RETURN_IF_ERROR(kcu::CopyToHost(ids->data(), ids_.data(), r * sizeof(int32_t), stream));
  return kcu::CopyToHost(values->data(), top_values_.data(), r * sizeof(float), stream);
}

absl::Status DeviceSampler::QueueSample(const float* logits, int64_t r, int64_t vocab,
                                        absl::Span<const DeviceSamplingRow> rows,
                                        kcu::CudaStream stream) {
  if (r < 0 || r > max_rows_ || static_cast<int64_t>(rows.size()) != r) {
    return absl::InvalidArgumentError(absl::StrCat("sampling ", rows.size(), " rows of ", r,
                                                   " logits rows (at most ", max_rows_, ")"));
  }
  if (r == 0) return absl::OkStatus();
  RETURN_IF_ERROR(GrowScratch(&sample_workspace_, kcu::SampleRowsWorkspaceBytes(r, vocab),
                              "sampling workspace", stream));
  ASSIGN_OR_RETURN(std::byte * host, params_staging_.Next());
  kcu::RowSamplingParams* params = reinterpret_cast<kcu::RowSamplingParams*>(host);
  for (int64_t i = 0; i < r; ++i) params[i] = ToKernelParams(rows[i]);
  RETURN_IF_ERROR(
      params_staging_.CopyToDevice(params_.data(), r * sizeof(kcu::RowSamplingParams), stream));
  return kcu::SampleRows(logits, r, vocab, params_.as<kcu::RowSamplingParams>(), ids_.as<int32_t>(),
                         sample_workspace_.data(), sample_workspace_.size(), stream);
}

absl::Status DeviceSampler::Sample(const float* logits, int64_t r, int64_t vocab,
                                   absl::Span<const DeviceSamplingRow> rows,
                                   std::vector<int32_t>* tokens, kcu::CudaStream stream) {
  tokens->resize(static_cast<size_t>(r));
  RETURN_IF_ERROR(QueueSample(logits, r, vocab, rows, stream));
  if (r > 0) {
    RETURN_IF_ERROR(kcu::CopyToHost(tokens->data(), ids_.data(), r * sizeof(int32_t), stream));
  }
  return kcu::Synchronize(stream);
}

absl::Status DeviceSampler::CheckSlices(absl::Span<const LogitsSlice> slices, int64_t r,
                                        int64_t vocab, size_t num_rows) const {
  if (static_cast<int64_t>(num_rows) != r || r < 0 || r > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_rows, " sampling rows for ", r, " logits rows (at most ", max_rows_, ")"));
  }
  int64_t next = 0;  // the slices must tile [0, vocab) in order
  for (const LogitsSlice& sl : slices) {
    if (sl.data == nullptr || sl.start != next || sl.cols <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SampleSlices: slice at column ", sl.start, " of ", sl.cols,
                       " does not continue the vocabulary at ", next));
    }
    next += sl.cols;
  }
  if (next != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleSlices: the slices cover ", next, " of ", vocab, " columns"));
  }
  return absl::OkStatus();
}

absl::Status DeviceSampler::SampleSlices(absl::Span<const LogitsSlice> slices, int64_t r,
                                         int64_t vocab, int ordinal,
                                         absl::Span<const DeviceSamplingRow> rows,
                                         std::vector<int32_t>* tokens, kcu::CudaStream stream) {
  RETURN_IF_ERROR(CheckSlices(slices, r, vocab, rows.size()));
  // One slice on this device (a one-rank group) is already the whole row
  // block: sample it where it is.
  if (slices.size() == 1 && slices[0].ordinal == ordinal) {
    return Sample(slices[0].data, r, vocab, rows, tokens, stream);
  }
  RETURN_IF_ERROR(GrowScratch(&gathered_, static_cast<size_t>(r * vocab) * sizeof(float),
                              "gathered logits", stream));
  float* full = gathered_.as<float>();
  for (const LogitsSlice& sl : slices) {
    // A peer's rows are copied once its step has written them; this
    // device's own are ordered by the stream already.
    if (r > 0 && sl.ready != nullptr && sl.ordinal != ordinal) {
      RETURN_IF_ERROR(sl.ready->WaitOn(stream));
    }
    RETURN_IF_ERROR(kcu::CopyRowsBetweenDevices(
        full + sl.start, ordinal, vocab * sizeof(float), sl.data, sl.ordinal,
        sl.cols * sizeof(float), sl.cols * sizeof(float), static_cast<size_t>(r), stream));
  }
  return Sample(full, r, vocab, rows, tokens, stream);
}

}  // namespace tessera::runner
