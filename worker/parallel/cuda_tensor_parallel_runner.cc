#include "worker/parallel/cuda_tensor_parallel_runner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/p2p_all_reduce.h"
#include "kernels/cuda_backend.h"

namespace tessera::parallel {

namespace {

// The ranks' device ordinals; INVALID_ARGUMENT for a device that is not a
// GPU or one named twice.
absl::StatusOr<std::vector<int>> RankOrdinals(
    const std::vector<kernels::DeviceDescription>& devices) {
  std::vector<int> ordinals;
  for (const kernels::DeviceDescription& d : devices) {
    if (d.kind != kernels::DeviceKind::kCuda) {
      return absl::InvalidArgumentError("every tensor-parallel rank needs a CUDA device");
    }
    if (std::find(ordinals.begin(), ordinals.end(), d.ordinal) != ordinals.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d.Summary(), " is named twice; each rank needs its own GPU"));
    }
    ordinals.push_back(d.ordinal);
  }
  return ordinals;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaTensorParallelRunner>> CudaTensorParallelRunner::Create(
    const model::LoadedModel* model, const model::ModelConfig& config,
    const std::vector<kernels::DeviceDescription>& devices, runner::CudaRunnerOptions options,
    const runner::CudaWeightsFactory& weights) {
  const int n = static_cast<int>(devices.size());
  if (auto s = CheckTensorParallel(config, n); !s.ok()) return s;
  absl::StatusOr<std::vector<int>> ordinals = RankOrdinals(devices);
  if (!ordinals.ok()) return ordinals.status();
  std::unique_ptr<CudaTensorParallelRunner> tp(new CudaTensorParallelRunner());
  if (n > 1) {
    if (auto s = tp->CreateCollectives(*ordinals, options.all_reduce_backend); !s.ok()) return s;
  }
  if (auto s = tp->CreateRanks(model, config, devices, options, weights); !s.ok()) return s;
  tp->local_logits_.resize(n);
  CudaTensorParallelRunner* self = tp.get();
  tp->lockstep_ = std::make_unique<LockstepRanks>(
      n, [self](int r) { return self->RunRank(r, *self->batch_); },
      /*spin=*/true);
  return tp;
}

absl::Status CudaTensorParallelRunner::CreateCollectives(const std::vector<int>& ordinals,
                                                         const std::string& backend) {
  auto nccl = kernels::cuda::NcclGroup::Create(ordinals);
  if (!nccl.ok()) return nccl.status();
  nccl_ = std::move(*nccl);
  if (backend == kernels::kP2pBackend) {
    auto p2p = kernels::cuda::P2pAllReduce::Create(ordinals, kernels::kP2pAllReduceMaxBytes / 2);
    if (!p2p.ok()) {
      return absl::Status(p2p.status().code(),
                          absl::StrCat("all_reduce backend p2p: ", p2p.status().message(),
                                       "; choose --all_reduce_backend=nccl"));
    }
    p2p_ = std::move(*p2p);
  } else if (backend != kernels::kNcclBackend) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA tensor-parallel group reduces with nccl or p2p, not '", backend, "'"));
  }
  return absl::OkStatus();
}

absl::Status CudaTensorParallelRunner::CreateRanks(
    const model::LoadedModel* model, const model::ModelConfig& config,
    const std::vector<kernels::DeviceDescription>& devices,
    const runner::CudaRunnerOptions& options, const runner::CudaWeightsFactory& weights) {
  const int n = static_cast<int>(devices.size());
  // One set of GEMM tuning picks for all ranks (gemm.h GemmTuningTable).
  auto tuning = std::make_shared<kernels::cuda::GemmTuningTable>();
  for (int r = 0; r < n; ++r) {
    auto plan = PlanShard(config, r, n);
    if (!plan.ok()) return plan.status();
    runner::CudaRunnerOptions ro = options;
    ro.shard = *plan;
    ro.nccl = nccl_.get();
    ro.p2p = p2p_.get();
    if (ro.gemm_tuning == nullptr) ro.gemm_tuning = tuning;
    auto rank = model != nullptr ? runner::CudaModelRunner::Create(model, devices[r], ro)
                                 : runner::CudaModelRunner::Create(config, weights, devices[r], ro);
    if (!rank.ok()) {
      return absl::Status(rank.status().code(),
                          absl::StrCat(plan->ToString(), " on ", devices[r].Summary(), ": ",
                                       rank.status().message()));
    }
    ranks_.push_back(std::move(*rank));
    plans_.push_back(*plan);
  }
  return absl::OkStatus();
}

CudaTensorParallelRunner::~CudaTensorParallelRunner() {
  lockstep_.reset();
  ranks_.clear();  // before the communicators and the P2P buffers go
}

int64_t CudaTensorParallelRunner::num_kv_blocks() const {
  int64_t blocks = ranks_[0]->num_kv_blocks();
  for (const auto& r : ranks_) blocks = std::min(blocks, r->num_kv_blocks());
  return blocks;
}

bool CudaTensorParallelRunner::SupportsTreeAttention() const {
  for (const auto& r : ranks_) {
    if (!r->SupportsTreeAttention()) return false;
  }
  return true;
}

absl::Status CudaTensorParallelRunner::CopyKvSlots(absl::Span<const int64_t> from,
                                                   absl::Span<const int64_t> to) {
  // Checked once against the group's cache, so no rank copies unless all do.
  const int64_t num_slots = num_kv_blocks() * block_size();
  for (size_t i = 0; i < from.size() && from.size() == to.size(); ++i) {
    if (from[i] < 0 || from[i] >= num_slots || to[i] < 0 || to[i] >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKvSlots: slot pair ", i, " (", from[i],
                                                     " -> ", to[i], ") outside the cache of ",
                                                     num_slots, " slots"));
    }
  }
  for (auto& r : ranks_) {
    if (absl::Status s = r->CopyKvSlots(from, to); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CudaTensorParallelRunner::RunRank(int r, const runner::ForwardBatch& batch) {
  if (greedy_) return ranks_[r]->ForwardTopOne(batch, &top_ids_[r], &top_values_[r]);
  if (on_device_) return ranks_[r]->ForwardToDevice(batch);
  if (sampling_) return SampleRank(r);
  std::vector<float>& local = local_logits_[r];
  if (absl::Status s = ranks_[r]->Forward(batch, &local); !s.ok()) return s;
  // Scatter this rank's vocabulary columns into the shared result (ranks
  // write disjoint columns).
  const int64_t rows = static_cast<int64_t>(batch.logits_indices.size());
  const int64_t vocab = config().vocab_size;
  const Range cols = plans_[r].vocab;
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(out_->data() + i * vocab + cols.start, local.data() + i * cols.size,
                static_cast<size_t>(cols.size) * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CudaTensorParallelRunner::Forward(const runner::ForwardBatch& batch,
                                               std::vector<float>* logits) {
  if (absl::Status h = Health(); !h.ok()) return h;
  logits->assign(batch.logits_indices.size() * static_cast<size_t>(config().vocab_size), 0.0f);
  out_ = logits;
  greedy_ = false;
  absl::Status s = RunAll(batch);
  out_ = nullptr;
  return AfterStep(std::move(s));
}

absl::Status CudaTensorParallelRunner::ForwardSample(
    const runner::ForwardBatch& batch, absl::Span<const runner::DeviceSamplingRow> rows,
    std::vector<int32_t>* tokens) {
  const int64_t r = static_cast<int64_t>(batch.logits_indices.size());
  if (static_cast<int64_t>(rows.size()) != r) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows.size(), " sampling rows for ", r, " logits rows"));
  }
  if (absl::Status h = Health(); !h.ok()) return h;
  on_device_ = true;
  absl::Status s = RunAll(batch);
  on_device_ = false;
  if (!s.ok()) return AfterStep(std::move(s));
  // Second round: every rank draws its share of the rows.
  sampling_ = true;
  sample_rows_ = rows;
  sample_tokens_.resize(size());
  s = RunAll(batch);
  sampling_ = false;
  sample_rows_ = {};
  if (s = AfterStep(std::move(s)); !s.ok()) return s;
  tokens->clear();
  for (const std::vector<int32_t>& part : sample_tokens_) {
    tokens->insert(tokens->end(), part.begin(), part.end());
  }
  return absl::OkStatus();
}

absl::Status CudaTensorParallelRunner::SampleRank(int r) {
  const int64_t total = static_cast<int64_t>(sample_rows_.size());
  const int64_t begin = total * r / size();
  const int64_t end = total * (r + 1) / size();
  std::vector<runner::LogitsSlice> slices;
  for (const auto& rank : ranks_) {
    runner::LogitsSlice sl = rank->device_logits();
    sl.data += begin * sl.cols;
    slices.push_back(sl);
  }
  return ranks_[r]->SampleSlices(slices, end - begin, sample_rows_.subspan(begin, end - begin),
                                 &sample_tokens_[r]);
}

absl::Status CudaTensorParallelRunner::ForwardGreedy(const runner::ForwardBatch& batch,
                                                     std::vector<int32_t>* tokens) {
  if (absl::Status h = Health(); !h.ok()) return h;
  greedy_ = true;
  top_ids_.resize(size());
  top_values_.resize(size());
  absl::Status s = RunAll(batch);
  greedy_ = false;
  if (s = AfterStep(std::move(s)); !s.ok()) return s;
  const size_t rows = batch.logits_indices.size();
  tokens->assign(rows, -1);
  for (size_t i = 0; i < rows; ++i) {
    float best = 0;
    for (int r = 0; r < size(); ++r) {
      const int32_t id = top_ids_[r][i];
      if (id < 0) continue;
      if ((*tokens)[i] < 0 || top_values_[r][i] > best) {  // ranks in id order: ties keep the lower
        best = top_values_[r][i];
        (*tokens)[i] = id;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaTensorParallelRunner::RunAll(const runner::ForwardBatch& batch) {
  batch_ = &batch;
  absl::Status s = lockstep_->Run();
  batch_ = nullptr;
  return s;
}

absl::Status CudaTensorParallelRunner::Health() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return broken_;
}

absl::Status CudaTensorParallelRunner::AfterStep(absl::Status s) {
  std::string why;
  // A step that succeeded has synchronized every rank (its results reached
  // the host), so the p2p all-reduce's "gave up" words are final.
  if (s.ok() && p2p_ != nullptr) {
    for (int r = 0; r < size() && why.empty(); ++r) {
      if (p2p_->TakeTimedOut(r)) {
        why = absl::StrCat("rank ", r,
                           "'s all-reduce stopped waiting for its peers after about 2 s (its "
                           "results were wrong)");
      }
    }
  }
  if (!s.ok()) why = OutOfStep(s);
  if (why.empty()) return s;
  absl::Status broken = absl::FailedPreconditionError(
      absl::StrCat("tensor-parallel group of ", size(), " ranks out of step: ", why,
                   s.ok() ? "" : absl::StrCat(" (the step failed: ", s.message(), ")"),
                   "; no further steps run; restart the worker"));
  std::lock_guard<std::mutex> lock(health_mu_);
  broken_ = broken;
  return broken;
}

std::string CudaTensorParallelRunner::OutOfStep(const absl::Status& s) {
  // A rejected batch is refused by every rank before any collective.
  if (s.code() == absl::StatusCode::kInvalidArgument) return "";
  if (p2p_ == nullptr) {
    return "a step failed after its NCCL all-reduces may have started on some ranks only";
  }
  // Let every rank's queued work end (a call whose peers never come gives
  // up after about 2 s), then compare the ranks' next calls.
  std::vector<uint32_t> next(size());
  for (int r = 0; r < size(); ++r) {
    if (absl::Status sync = ranks_[r]->Synchronize(); !sync.ok()) {
      return absl::StrCat("rank ", r, "'s GPU failed: ", sync.message());
    }
    absl::StatusOr<uint32_t> call = p2p_->CallIndex(r);
    if (!call.ok()) {
      return absl::StrCat("rank ", r, "'s all-reduce state: ", call.status().message());
    }
    next[r] = *call;
  }
  for (int r = 0; r < size(); ++r) {
    if (p2p_->TakeTimedOut(r)) {
      return absl::StrCat("rank ", r, "'s all-reduce stopped waiting for its peers");
    }
    if (next[r] != next[0]) return "the ranks stopped at different all-reduce calls";
  }
  return "";
}

absl::Status CudaTensorParallelRunner::DesyncAllReduceForTest(int rank) {
  if (p2p_ == nullptr || rank < 0 || rank >= size()) {
    return absl::FailedPreconditionError("DesyncAllReduceForTest needs the p2p all-reduce");
  }
  if (absl::Status s = ranks_[rank]->Synchronize(); !s.ok()) return s;
  absl::StatusOr<kernels::cuda::Stream> stream = kernels::cuda::Stream::Create();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<kernels::cuda::DeviceBuffer> data = kernels::cuda::DeviceBuffer::Allocate(16);
  if (!data.ok()) return data.status();
  if (absl::Status s = kernels::cuda::MemsetDevice(data->data(), 0, 16, stream->get()); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          p2p_->AllReduceSumBf16(rank, data->as<kernels::cuda::Bf16>(), 8, stream->get());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = kernels::cuda::Synchronize(stream->get()); !s.ok()) return s;
  p2p_->TakeTimedOut(rank);  // this call's own timeout: the next step must find its own
  return absl::OkStatus();
}

}  // namespace tessera::parallel
