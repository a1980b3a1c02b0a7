// CpuWeightLoader: turns checkpoint tensor views into the matrices and
// vectors the CPU kernels read, for one runner (or one tensor-parallel
// rank): matrices in place from the memory map when aligned, else copied;
// fused row stacks (q/k/v, gate/up) and column slices as owned copies in
// the checkpoint's dtype (fp32 when the parts' dtypes differ); norms and
// biases widened to fp32. The loader owns every copy, so it must outlive
// the matrices it returned.
//
// Thread-safety: not thread-safe; used while a runner prepares its weights.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/op_args.h"
#include "worker/model/tensor.h"
#include "worker/parallel/shard_plan.h"

namespace tessera::runner {

class CpuWeightLoader {
 public:
  // The matrix in place when aligned to its element size, else a copy.
  absl::StatusOr<kernels::cpu::WeightMatrix> Matrix(const model::TensorView& t);
  // Rows of several matrices stacked into one owned matrix.
  absl::StatusOr<kernels::cpu::WeightMatrix> Fuse(
      std::initializer_list<const model::TensorView*> parts);
  // Columns [r.start, r.end()) of a matrix as an owned copy (only those
  // bytes of each row are read); the matrix itself when r is all of it.
  absl::StatusOr<kernels::cpu::WeightMatrix> Columns(const model::TensorView& t, parallel::Range r);

  // Rows [r.start, r.end()) of `t` as a view of the same bytes.
  static absl::StatusOr<model::TensorView> Rows(const model::TensorView& t, parallel::Range r);
  // Entries [r.start, r.end()) of a vector, widened to fp32.
  static absl::StatusOr<std::vector<float>> Floats(const model::TensorView& t, parallel::Range r);
  // All of a tensor widened to fp32; empty when `t` is unset.
  static absl::StatusOr<std::vector<float>> Floats(const model::TensorView& t);
  static absl::StatusOr<std::vector<float>> Floats(const std::optional<model::TensorView>& t);

  // Keeps `values` alive as long as the loader (FP8 scales expanded at load).
  const float* OwnFloats(std::vector<float> values);

 private:
  // Each copy in its own allocation: returned matrices point into them.
  std::vector<std::unique_ptr<std::vector<std::byte>>> owned_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_floats_;
  const std::byte* Own(std::vector<std::byte> bytes);
};

}  // namespace tessera::runner
