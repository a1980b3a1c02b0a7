#include "services/worker/worker_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/sampling_convert.h"

namespace tessera::services {

absl::StatusOr<engine::EngineRequest> ToEngineRequest(const tessera::v1::WorkerGenerateRequest& req,
                                                      int vocab, int context,
                                                      uint64_t random_seed) {
  engine::EngineRequest r;
  r.request_id = req.request_id();
  if (req.prompt_ids().empty()) return absl::InvalidArgumentError("prompt_ids must not be empty");
  for (int i = 0; i < req.prompt_ids_size(); ++i) {
    int32_t id = req.prompt_ids(i);
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_ids[", i, "] is ", id, ": ids must be in [0, ", vocab, ")"));
    }
  }
  for (int i = 0; i < req.generated_ids_size(); ++i) {
    int32_t id = req.generated_ids(i);
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("generated_ids[", i, "] is ", id, ": ids must be in [0, ", vocab, ")"));
    }
  }
  const int used = req.prompt_ids_size();
  auto sampling = ConvertSampling(req.sampling(), vocab, context - used, random_seed);
  if (!sampling.ok()) return sampling.status();
  if (req.generated_ids_size() >= sampling->max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("generated_ids holds ", req.generated_ids_size(),
                                                   " tokens: max_tokens (", sampling->max_tokens,
                                                   ") counts them, nothing left"));
  }
  r.prompt.assign(req.prompt_ids().begin(), req.prompt_ids().end());
  r.generated.assign(req.generated_ids().begin(), req.generated_ids().end());
  r.sampling = sampling->params;
  r.max_tokens = sampling->max_tokens;
  r.ignore_eos = sampling->ignore_eos;
  r.stop_token_ids = std::move(sampling->stop_token_ids);
  r.logprobs = sampling->logprobs;
  r.priority = static_cast<int>(req.priority());
  return r;
}

}  // namespace tessera::services
