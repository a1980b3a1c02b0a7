#include "worker/parallel/in_process_group.h"

#include <algorithm>
#include <cstring>

namespace tessera::parallel {

class InProcessGroup::Rank final : public Collectives {
 public:
  Rank(InProcessGroup* group, int rank) : group_(group), rank_(rank) {
    inputs.resize(group->size());
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void AllReduceSum(const kernels::cpu::CpuContext& ctx, float* data, int64_t n) override {
    group_->AllReduceSum(rank_, ctx, data, n);
  }
  void GatherColumnsToRoot(const float* local, int64_t rows, int64_t local_cols, int64_t col_offset,
                           int64_t total_cols, float* root_out) override {
    group_->GatherColumnsToRoot(rank_, local, rows, local_cols, col_offset, total_cols, root_out);
  }

  std::vector<const float*> inputs;  // this rank's reduce inputs (scratch)
  int64_t calls = 0;                 // all-reduce calls made

 private:
  InProcessGroup* group_;
  int rank_;
};

InProcessGroup::InProcessGroup(int size, ReduceFn reduce)
    : size_(size), reduce_(reduce), barrier_(size), buffers_(size, nullptr) {
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
}

InProcessGroup::~InProcessGroup() = default;

Collectives* InProcessGroup::rank(int rank) { return ranks_[rank].get(); }

void InProcessGroup::AllReduceSum(int rank, const kernels::cpu::CpuContext& ctx, float* data,
                                  int64_t n) {
  if (size_ == 1) return;
  Rank& me = *ranks_[rank];
  std::vector<float>& result = result_[me.calls++ & 1];
  buffers_[rank] = data;
  if (rank == 0 && result.size() < static_cast<size_t>(n)) result.resize(n);
  barrier_.arrive_and_wait();

  // This rank's slice of the elements, summed over every rank's buffer.
  const int64_t base = n / size_, extra = n % size_;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t len = base + (rank < extra ? 1 : 0);
  if (len > 0) {
    for (int r = 0; r < size_; ++r) me.inputs[r] = buffers_[r] + begin;
    reduce_(ctx, me.inputs, len, result.data() + begin);
  }
  barrier_.arrive_and_wait();
  std::memcpy(data, result.data(), sizeof(float) * n);
}

void InProcessGroup::GatherColumnsToRoot(int rank, const float* local, int64_t rows,
                                         int64_t local_cols, int64_t col_offset, int64_t total_cols,
                                         float* root_out) {
  if (size_ == 1) {
    if (local != root_out) {
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(root_out + i * total_cols + col_offset, local + i * local_cols,
                    sizeof(float) * local_cols);
      }
    }
    return;
  }
  if (rank == 0) gather_out_ = root_out;
  barrier_.arrive_and_wait();
  float* out = gather_out_;
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(out + i * total_cols + col_offset, local + i * local_cols,
                sizeof(float) * local_cols);
  }
  barrier_.arrive_and_wait();
}

}  // namespace tessera::parallel
