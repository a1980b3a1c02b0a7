// Shared-memory mbarrier helpers (SM 9.0+) of the kernels that wait for
// bulk or asynchronous copies: gemv.cu's staged GEMV and the SM 9.0 prefill
// attention. Included by .cu files; defined only where device code is
// compiled for SM 9.0 or newer (callers guard their use the same way).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Shared-memory address of a barrier, as the mbarrier instructions take it.
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes initialized barriers visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void MbarFenceInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}

// One arrival that also expects `bytes` more of transactions (bulk copies
// completing on the barrier) before the phase completes.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Whether the phase of parity `parity` has completed. With a suspend hint
// the thread sleeps until the phase completes or that many nanoseconds
// pass, instead of returning after the system-dependent limit: waits
// that would otherwise spin for long (the prefill kernel's consumers) use
// it; short waits (the staged GEMV's) do not.
template <uint32_t kSuspendHintNs = 0>
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  if constexpr (kSuspendHintNs == 0) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "n"(kSuspendHintNs)
        : "memory");
  }
  return done != 0;
}

// Waits until the phase of parity `parity` has completed, at most
// `timeout_ns`: then sets `timed_out` and returns (and returns at once
// while it is set), so a copy that never lands ends the kernel with wrong
// results rather than a hang.
template <uint32_t kSuspendHintNs = 0>
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity, uint64_t timeout_ns,
                                         bool& timed_out) {
  if (timed_out || MbarTryWait<kSuspendHintNs>(bar, parity)) return;
  const uint64_t start = GlobalTimerNs();
  while (!MbarTryWait<kSuspendHintNs>(bar, parity)) {
    if (GlobalTimerNs() - start > timeout_ns) {
      timed_out = true;
      return;
    }
  }
}

#endif  // __CUDA_ARCH__ >= 900

}  // namespace tessera::kernels::cuda
