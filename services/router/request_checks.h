// The router's checks of a public request before any work is done for it:
// the model it names, and the size of a text prompt against what the
// model's context can hold. Shared by InferenceService and the request-path
// fuzzer (tests/fuzz/request_fuzz.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera::services {

// OK when `requested` is empty or `served`; else NOT_FOUND naming (a
// bounded, escaped piece of) the requested name.
absl::Status CheckModelName(absl::string_view requested, absl::string_view served);

// INVALID_ARGUMENT when a text of `bytes` bytes is longer than
// `max_prompt_bytes` (0 = no such limit) or than any text the context of
// `context` tokens can hold: at least bytes / max_bytes_per_token tokens,
// a third of that when NFC may shrink the text (no bound when the
// tokenizer gives none, or the context is not known yet, 0).
absl::Status CheckPromptBytes(size_t bytes, size_t max_prompt_bytes, int64_t context,
                              const Tokenizer* tokenizer);

}  // namespace tessera::services
