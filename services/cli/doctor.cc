// `tessera doctor`: what this build and this machine can run.
#include <cstdio>

#include "absl/strings/str_join.h"
#include "kernels/registry.h"
#include "services/cli/commands.h"
#include "services/common/version.h"
#if TESSERA_HAVE_CUDA
#include "kernels/cuda/device_query.h"
#endif

namespace tessera::cli {

int RunDoctor(const std::vector<char*>&) {
  std::printf("tessera %s\n", services::kTesseraVersion);
  std::printf("cuda backend built: %s\n", services::kTesseraCudaBuilt ? "yes" : "no");
#if TESSERA_HAVE_CUDA
  kernels::cuda::CudaQueryResult cuda = kernels::cuda::QueryCudaDevices();
  std::printf("cuda runtime: %d.%d, driver: %d.%d\n", cuda.info.runtime_version / 1000,
              (cuda.info.runtime_version % 1000) / 10, cuda.info.driver_version / 1000,
              (cuda.info.driver_version % 1000) / 10);
  if (!cuda.note.empty()) std::printf("cuda: %s\n", cuda.note.c_str());
  for (const auto& d : cuda.info.devices) {
    std::printf("  gpu %s: %s, sm_%d%d, %d SMs, %lld MiB, %lld KiB smem/block\n",
                d.pci_bus_id.c_str(), d.name.c_str(), d.sm_major, d.sm_minor, d.sm_count,
                static_cast<long long>(d.total_memory_bytes >> 20),
                static_cast<long long>(d.shared_memory_per_block_optin >> 10));
  }
#endif
  std::printf("\nbackend overrides (flag: choices)\n");
  for (const kernels::BackendFlag& f : kernels::BackendFlags()) {
    std::printf("  --%-20s auto, %s  (%s)\n", std::string(f.flag).c_str(),
                absl::StrJoin(kernels::KnownBackends(f.flag), ", ").c_str(),
                std::string(f.description).c_str());
  }
  return 0;
}

}  // namespace tessera::cli
