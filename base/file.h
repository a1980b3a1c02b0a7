// Bounded reads of whole files (configs, tokenizers, templates, keys):
// a file larger than the caller's limit is refused before it is read, so a
// hostile or mistaken path (a device, a multi-GiB file) cannot exhaust memory.
//
// Thread-safety: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {

// The bytes of the regular file at `path`, of at most `max_bytes`. Errors
// start with the path: NOT_FOUND (or the errno's code) when it cannot be
// opened, INVALID_ARGUMENT when it is not a regular file or is larger than
// the limit (also when it grows past it while being read), DATA_LOSS on a
// read error.
absl::StatusOr<std::string> ReadFileBounded(const std::string& path, uint64_t max_bytes);

// Whether `path` names an existing file system entry.
bool PathExists(const std::string& path);

}  // namespace tessera
