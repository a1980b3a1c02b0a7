// `tessera doctor`: what this build and this machine can run.
#include <cstdio>

#include "absl/strings/str_join.h"
#include "kernels/registry.h"
#include "services/cli/commands.h"
#include "services/common/version.h"

namespace tessera::cli {

int RunDoctor(const std::vector<char*>&) {
  std::printf("tessera %s\n", services::kTesseraVersion);
  std::printf("cuda backend built: %s\n", services::kTesseraCudaBuilt ? "yes" : "no");
  std::printf("\nbackend overrides (flag: choices)\n");
  for (const kernels::BackendFlag& f : kernels::BackendFlags()) {
    std::printf("  --%-20s auto, %s  (%s)\n", std::string(f.flag).c_str(),
                absl::StrJoin(kernels::KnownBackends(f.flag), ", ").c_str(),
                std::string(f.description).c_str());
  }
  return 0;
}

}  // namespace tessera::cli
