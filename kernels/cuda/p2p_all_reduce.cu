#include "kernels/cuda/p2p_all_reduce.h"

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxRanks = 8;
constexpr uint64_t kMaxSpins = uint64_t{1} << 26;  // about a second of polling

struct PeerTable {
  __nv_bfloat16* staging[kMaxRanks];
  uint32_t* flags[kMaxRanks];
};

__global__ void OneShotAllReduceKernel(__nv_bfloat16* data, int64_t n, int rank, int world,
                                       const PeerTable* table, uint32_t* state, int64_t cap) {
  __shared__ uint32_t round;
  if (threadIdx.x == 0) round = state[0] + 1;
  __syncthreads();
  const int64_t half = (round & 1) * cap;
  __nv_bfloat16* mine = table->staging[rank] + half;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mine[i] = data[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the staging writes before the flags
    for (int p = 0; p < world; ++p) {
      if (p != rank) *reinterpret_cast<volatile uint32_t*>(table->flags[p] + rank) = round;
    }
    volatile uint32_t* arrived = table->flags[rank];
    bool timed_out = false;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      uint64_t spins = 0;
      while (static_cast<int32_t>(arrived[p] - round) < 0) {
        if (++spins > kMaxSpins) {
          timed_out = true;
          break;
        }
      }
    }
    if (timed_out) state[1] += 1;
    __threadfence_system();
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float sum = 0.0f;
    for (int p = 0; p < world; ++p) {
      const __nv_bfloat16* src = table->staging[p] + half;
      // .cv: fetch again, never a stale cached copy of a peer's memory.
      const unsigned short bits = __ldcv(reinterpret_cast<const unsigned short*>(src + i));
      sum += __bfloat162float(__ushort_as_bfloat16(bits));
    }
    data[i] = __float2bfloat16(sum);
  }
  if (threadIdx.x == 0) state[0] = round;
}

}  // namespace

absl::StatusOr<std::unique_ptr<P2pAllReduce>> P2pAllReduce::Create(const std::vector<int>& ordinals,
                                                                   int64_t max_count) {
  const int n = static_cast<int>(ordinals.size());
  if (n < 2 || n > kMaxRanks) {
    return absl::InvalidArgumentError("P2pAllReduce needs 2 to 8 devices");
  }
  if (max_count < 1) return absl::InvalidArgumentError("P2pAllReduce: max_count must be >= 1");
  std::unique_ptr<P2pAllReduce> g(new P2pAllReduce);
  g->ordinals_ = ordinals;
  g->max_count_ = max_count;
  for (int a = 0; a < n; ++a) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals[a]));
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, ordinals[a], ordinals[b]));
      if (!can) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", ordinals[a], " cannot access device ", ordinals[b], "'s memory"));
      }
      const cudaError_t err = cudaDeviceEnablePeerAccess(ordinals[b], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (err != cudaSuccess) {
        return CudaError(err, "cudaDeviceEnablePeerAccess");
      }
    }
    for (auto* list : {&g->staging_, &g->flags_, &g->state_, &g->tables_}) list->emplace_back();
    const size_t sizes[] = {static_cast<size_t>(2 * max_count) * sizeof(__nv_bfloat16),
                            kMaxRanks * sizeof(uint32_t), 2 * sizeof(uint32_t), sizeof(PeerTable)};
    DeviceBuffer* bufs[] = {&g->staging_[a], &g->flags_[a], &g->state_[a], &g->tables_[a]};
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(sizes[i]);
      if (!b.ok()) return b.status();
      TESSERA_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, sizes[i]));
      *bufs[i] = std::move(*b);
    }
  }
  PeerTable table{};
  for (int r = 0; r < n; ++r) {
    table.staging[r] = g->staging_[r].as<__nv_bfloat16>();
    table.flags[r] = g->flags_[r].as<uint32_t>();
  }
  for (int r = 0; r < n; ++r) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals[r]));
    TESSERA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(g->tables_[r].data(), &table, sizeof(table), cudaMemcpyHostToDevice));
    TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  return g;
}

absl::Status P2pAllReduce::AllReduceSumBf16(int rank, Bf16* data, int64_t count,
                                            CudaStream stream) {
  if (rank < 0 || rank >= size()) return absl::InvalidArgumentError("P2P rank out of range");
  if (count < 0 || count > max_count_ || (count > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("P2P all-reduce of ", count, " values (at most ", max_count_, ")"));
  }
  if (count == 0) return absl::OkStatus();
  OneShotAllReduceKernel<<<1, 1024, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(data), count,
                                                 rank, size(), tables_[rank].as<const PeerTable>(),
                                                 state_[rank].as<uint32_t>(), max_count_);
  return CudaError(cudaGetLastError(), "P2P all-reduce");
}

absl::StatusOr<uint32_t> P2pAllReduce::Timeouts(int rank) {
  uint32_t state[2] = {0, 0};
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals_[rank]));
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(state, state_[rank].data(), sizeof(state), cudaMemcpyDeviceToHost));
  return state[1];
}

}  // namespace tessera::kernels::cuda
