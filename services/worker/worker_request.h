// The worker's request conversion: a Worker.Generate request as the engine
// takes it, with every check a client's request gets (ids in the
// vocabulary, sampling fields, max_tokens against the context). Shared by
// WorkerService and the request-path fuzzer (tests/fuzz/request_fuzz.cc).
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "tessera/v1/worker.pb.h"
#include "worker/engine/engine.h"

namespace tessera::services {

// INVALID_ARGUMENT names the offending field. `context` is the engine's
// max_model_len; `random_seed` is used when the request sets no seed.
absl::StatusOr<engine::EngineRequest> ToEngineRequest(const tessera::v1::WorkerGenerateRequest& req,
                                                      int vocab, int context, uint64_t random_seed);

}  // namespace tessera::services
