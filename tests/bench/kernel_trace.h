// Kernel timeline of a benchmark window through CUPTI's activity API: the
// start and end of every kernel the GPUs ran (graph nodes included), so a
// decode step can be broken down by kernel without a profiler on the host.
//
// Enable() once, before the CUDA graphs to be traced are instantiated; then
// Now() before and after the window and Collect(begin, end). Tracing slows
// launches a little, so time throughput in a run without it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::bench {

struct KernelRecord {
  std::string name;  // demangled, without namespaces and parameters
  uint32_t device = 0;
  uint64_t start_ns = 0, end_ns = 0;
};

class KernelTrace {
 public:
  // Starts recording kernel activity for the process (idempotent).
  static absl::Status Enable();
  // CUPTI's clock (the records' time base), in ns.
  static uint64_t Now();
  // Flushes the records and returns those of kernels that started in
  // [begin, end), sorted by device and start; every older record is dropped.
  static absl::StatusOr<std::vector<KernelRecord>> Collect(uint64_t begin, uint64_t end);
};

// Per device: the window's span, the time with at least one kernel running,
// the idle time split into gaps under and over `long_gap_us` (the first are
// kernel-to-kernel gaps inside a graph, the second waits on the host), and
// the kernels by total time (at most `top` names, the rest summed) with the
// short gaps that followed each, all per step for `steps` steps.
nlohmann::json SummarizeKernels(const std::vector<KernelRecord>& records, int steps, int top = 24,
                                double long_gap_us = 20.0);

// Short form of a (possibly mangled) kernel name: demangled, leading return
// type, namespaces and the parameter list removed, at most 96 characters.
std::string ShortKernelName(const char* name);

}  // namespace tessera::bench
