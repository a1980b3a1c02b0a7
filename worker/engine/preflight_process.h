// The kernel preflight in a process of its own.
//
// A CUDA worker preflights every chosen kernel before its weights load
// (worker/runner/cuda/cuda_preflight.h). Run in the worker's own process, the
// preflight (its clears of its buffers, some 40 small cudaMemset calls, are
// enough; filling them by copies instead did not help) made every
// CUDA-graph decode step of the runner slower on the H200: about
// 0.5 us more between each two kernels of a step, the kernels' own times
// unchanged (kernels/README.md, start-up). A preflight in a child process
// leaves the worker's CUDA context untouched: the child is this binary
// again, started with kPreflightChildArg, which resolves the same devices,
// selects the same backends, runs the preflight and prints one result line
// before it exits.
//
// Every binary that builds a CUDA engine (tessera-worker, tessera) calls
// RunPreflightChildIfAsked first in main(). A binary that does not (tests)
// answers without the result line; the caller then preflights in its own
// process, as before. BuildLocalEngine also preflights in its own process
// on a GPU in the EXCLUSIVE_PROCESS compute mode (GpuInfo::exclusive_process),
// where the child could not open a context beside the caller's.
//
// Thread-safety: PreflightInChildProcess may be called from any thread
// (posix_spawn; it blocks until the child exits).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/device.h"
#include "kernels/registry.h"

namespace tessera::engine {

// argv[1] of a preflight child.
inline constexpr char kPreflightChildArg[] = "--tessera-preflight-child";

// With argv[1] == kPreflightChildArg: runs the preflight that argv[2..]
// describe (device selector, tensor-parallel size, then backend overrides
// as flag=value), prints the result line on stdout and returns the exit
// status for main (0 ok, 1 failed). Otherwise returns -1 and does nothing.
int RunPreflightChildIfAsked(int argc, char** argv);

// The preflight itself, in this process: every device of `devices` with
// the kernels `report` chose (CUDA: runner::PreflightCudaKernels on each;
// CPU: kernels::PreflightCpuKernels on the calling thread). What the child
// runs, and what BuildLocalEngine runs when there is no child.
absl::Status PreflightDevices(const std::vector<kernels::DeviceDescription>& devices,
                              const kernels::SelectionReport& report);

// The preflight of `device_selector`'s first `tensor_parallel_size` devices
// (kernels::ResolveDevices) with `backends`, in a child process:
// true and OK when it passed; its error (FAILED_PRECONDITION naming the
// device and the fix, as in-process) when it failed; false when the child
// gave no result (this binary lacks RunPreflightChildIfAsked, or the child
// could not start or died), so the caller should preflight in-process.
// `executable` is the child's program (tests start others).
absl::StatusOr<bool> PreflightInChildProcess(absl::string_view device_selector,
                                             int tensor_parallel_size,
                                             const kernels::BackendOverrides& backends,
                                             const std::string& executable = "/proc/self/exe");

// What a child's stdout says: true and OK, false and OK (no result line),
// or the error it reported. For tests.
absl::StatusOr<bool> ParsePreflightChildOutput(absl::string_view out);

// The result line for `s` (what the child prints). For tests.
std::string PreflightResultLine(const absl::Status& s);

}  // namespace tessera::engine
