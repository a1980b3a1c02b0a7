// What each runner can run, asked before it is built: one place that
// refuses a model a runner lacks the kernels for, with the reason and the
// alternative, instead of a failure deep inside weight preparation.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "base/str_cat.h"
#include "worker/model/config.h"

namespace tessera::model {

// OK, or UNIMPLEMENTED naming the feature the CUDA runners do not have yet:
// multi-head latent attention (DeepseekV3ForCausalLM: DeepSeek-V3, Kimi K2).
inline absl::Status CheckCudaRunnerSupports(const ModelConfig& config) {
  if (config.mla) {
    return absl::UnimplementedError(
        Cat(ArchitectureName(config.architecture), " (model_type \"", config.model_type,
            "\") uses multi-head latent attention, which the CUDA runner does not implement "
            "yet; run it with --device=cpu (the CPU runner's MLA reference, docs/mla.md)"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::model
