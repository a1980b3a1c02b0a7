// Holds SMs of the current device busy for a while, for tests of kernels
// whose CTAs wait for each other (sampling.h's groups): a kernel of `ctas`
// CTAs, each taking the whole opt-in shared memory a CTA may have (so no
// other kernel's CTA with shared memory fits beside it on its SM), that
// spins for `seconds` and exits.
//
// Thread-safety: enqueues on `stream`.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// INVALID_ARGUMENT for ctas < 1 or seconds outside (0, 60]; INTERNAL on a
// runtime error.
absl::Status OccupySms(int ctas, double seconds, CudaStream stream);

// How many CTAs of that kernel (32 threads, no shared memory) one SM of the
// current device holds, from the runtime's occupancy query; for
// diagnostics of what such a query changes (tests/bench/gpu_tp_bench
// --pre=occupancy).
absl::StatusOr<int> OccupyKernelCtasPerSm();

// One CTA of 32 threads of a kernel that needs 1 KiB of local memory per
// thread (a stack frame), writing 32 ints to `out`: for diagnostics of what
// a kernel with local memory changes (tests/bench/gpu_tp_bench --pre=lmem).
absl::Status RunLocalMemoryKernel(int* out, int seed, CudaStream stream);

}  // namespace tessera::kernels::cuda
