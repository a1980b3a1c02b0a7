// The kernel registry: for every op the model runs, an ordered list of
// candidate implementations, and the rules that pick one per device.
//
// This file currently holds the operator-facing part: the backend override
// flags (`--gemm_backend`, `--attention_backend`, ...) and their validation,
// so that a wrong name is a start-up error and never a silent fallback.
//
// Thread-safety: all functions are pure and safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tessera::kernels {

// One override flag and the op family it controls.
struct BackendFlag {
  std::string_view flag;         // e.g. "attention_backend"
  std::string_view description;  // what it controls
};

// Every backend override flag the services accept.
const std::vector<BackendFlag>& BackendFlags();

// Names a user may pass to `flag` ("auto" is always valid): the candidates
// registered for that op family in this build.
std::vector<std::string> KnownBackends(std::string_view flag);

// OK when `name` is "auto" or a known backend of `flag`; otherwise
// INVALID_ARGUMENT naming the flag, the bad value and the valid choices.
absl::Status ValidateBackendOverride(std::string_view flag, std::string_view name);

}  // namespace tessera::kernels
