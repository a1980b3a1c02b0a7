#include "kernels/cuda/p2p_all_reduce.h"

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxRanks = 8;
constexpr int kMaxCtas = 32;
constexpr int kThreads = 512;
constexpr int64_t kBytesPerCta = 16 << 10;
constexpr uint64_t kMaxSpins = uint64_t{1} << 26;  // about a second of polling

struct PeerTable {
  // inbox[r]: rank r's receive buffer, [2 halves][kMaxRanks senders][cap].
  __nv_bfloat16* inbox[kMaxRanks];
  // flags[r]: rank r's arrival flags, [kMaxCtas][kMaxRanks senders].
  uint32_t* flags[kMaxRanks];
};

__device__ __forceinline__ void StoreVolatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Adds 8 bf16 values (a 16-byte vector) to 8 fp32 sums.
__device__ __forceinline__ void Accumulate(float (&acc)[8], uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[2 * j] += __uint_as_float(w[j] << 16);
    acc[2 * j + 1] += __uint_as_float(w[j] & 0xffff0000u);
  }
}

// One CTA per slice of the message; CTA c of every rank meets only CTA c of
// the other ranks (its own flags and round counter), so the slices proceed
// independently.
//   1. push: the slice goes into every peer's inbox (16-byte stores over
//      NVLink, no round trip to wait for);
//   2. fence, then one flag per peer (written into the peer's memory);
//   3. wait for every peer's flag in the local memory;
//   4. sum all ranks' copies in rank order (fp32) into data: each rank
//      computes bitwise the same values.
// Inbox halves alternate by round parity: a rank writes half h of round r
// only after every peer has entered round r - 1 (step 3 of that round),
// hence finished reading half h in round r - 2.
__global__ void __launch_bounds__(kThreads)
    PushAllReduceKernel(__nv_bfloat16* data, int64_t n, int rank, int world, const PeerTable* table,
                        uint32_t* state, int64_t cap) {
  __shared__ uint32_t round;
  const int c = blockIdx.x;
  if (threadIdx.x == 0) round = state[c] + 1;
  __syncthreads();
  const int64_t half = static_cast<int64_t>(round & 1) * kMaxRanks * cap;
  const bool vec = n % 8 == 0 && (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const int64_t units = vec ? n / 8 : n;  // 16-byte vectors, or single values
  const int64_t per = (units + gridDim.x - 1) / gridDim.x;
  const int64_t u0 = min(units, c * per);
  const int64_t u1 = min(units, u0 + per);

  const PeerTable t = *table;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    if (vec) {
      const uint4 v = reinterpret_cast<const uint4*>(data)[u];
      for (int p = 0; p < world; ++p) {
        if (p == rank) continue;
        reinterpret_cast<uint4*>(t.inbox[p] + half + rank * cap)[u] = v;
      }
    } else {
      const __nv_bfloat16 v = data[u];
      for (int p = 0; p < world; ++p) {
        if (p != rank) t.inbox[p][half + rank * cap + u] = v;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the pushed slice before the flags
    for (int p = 0; p < world; ++p) {
      if (p != rank) StoreVolatile(t.flags[p] + c * kMaxRanks + rank, round);
    }
    const uint32_t* arrived = t.flags[rank] + c * kMaxRanks;
    bool timed_out = false;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      uint64_t spins = 0;
      while (static_cast<int32_t>(LoadVolatile(arrived + p) - round) < 0) {
        if (++spins > kMaxSpins) {
          timed_out = true;
          break;
        }
      }
    }
    if (timed_out) atomicAdd(&state[kMaxCtas], 1u);
    __threadfence_system();  // the flags before the peers' data
  }
  __syncthreads();
  const __nv_bfloat16* box = t.inbox[rank] + half;
  for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
    if (vec) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int p = 0; p < world; ++p) {
        // .cg: from L2, which the peers' stores went through; never a line
        // an earlier round left in L1.
        const uint4 v = p == rank ? reinterpret_cast<const uint4*>(data)[u]
                                  : __ldcg(reinterpret_cast<const uint4*>(box + p * cap) + u);
        Accumulate(acc, v);
      }
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = static_cast<uint32_t>(FloatToBf16Bits(acc[2 * j])) |
               (static_cast<uint32_t>(FloatToBf16Bits(acc[2 * j + 1])) << 16);
      }
      reinterpret_cast<uint4*>(data)[u] = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      float sum = 0.f;
      for (int p = 0; p < world; ++p) {
        const unsigned short bits =
            p == rank ? __bfloat16_as_ushort(data[u])
                      : __ldcg(reinterpret_cast<const unsigned short*>(box + p * cap + u));
        sum += Bf16BitsToFloat(bits);
      }
      data[u] = __ushort_as_bfloat16(FloatToBf16Bits(sum));
    }
  }
  if (threadIdx.x == 0) state[c] = round;
}

int CtasFor(int64_t count) {
  const int64_t ctas = (count * 2 + kBytesPerCta - 1) / kBytesPerCta;
  return static_cast<int>(std::clamp<int64_t>(ctas, 1, kMaxCtas));
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
    for (auto* list : {&g->inbox_, &g->flags_, &g->state_, &g->tables_}) list->emplace_back();
    const size_t sizes[] = {static_cast<size_t>(2 * kMaxRanks * max_count) * sizeof(__nv_bfloat16),
                            kMaxCtas * kMaxRanks * sizeof(uint32_t),
                            (kMaxCtas + 1) * sizeof(uint32_t), sizeof(PeerTable)};
    DeviceBuffer* bufs[] = {&g->inbox_[a], &g->flags_[a], &g->state_[a], &g->tables_[a]};
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(sizes[i]);
      if (!b.ok()) return b.status();
      TESSERA_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, sizes[i]));
      *bufs[i] = std::move(*b);
    }
  }
  PeerTable table{};
  for (int r = 0; r < n; ++r) {
    table.inbox[r] = g->inbox_[r].as<__nv_bfloat16>();
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
  PushAllReduceKernel<<<CtasFor(count), kThreads, 0, AsCuda(stream)>>>(
      reinterpret_cast<__nv_bfloat16*>(data), count, rank, size(),
      tables_[rank].as<const PeerTable>(), state_[rank].as<uint32_t>(), max_count_);
  return CudaError(cudaGetLastError(), "P2P all-reduce");
}

absl::StatusOr<uint32_t> P2pAllReduce::Timeouts(int rank) {
  uint32_t timeouts = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinals_[rank]));
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&timeouts, state_[rank].as<uint32_t>() + kMaxCtas,
                                          sizeof(timeouts), cudaMemcpyDeviceToHost));
  return timeouts;
}

}  // namespace tessera::kernels::cuda
