// Strict JSON parsing for files we load (safetensors headers, config.json,
// checkpoint indexes): nlohmann::json without exceptions, with the byte
// position of a syntax error in the message, and with duplicate object keys
// rejected (nlohmann would silently keep the last one).
//
// Thread-safety: all functions are pure and safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera {

// Parses `text` as one JSON value (surrounding whitespace allowed). Errors are
// INVALID_ARGUMENT: "invalid JSON at byte N: <reason>", or "duplicate key "k"
// at the top level" / "duplicate key "k" in object at /a/0" (a JSON pointer of
// keys and array indexes).
absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text);
// The same, keeping object keys in the order the text gives them (what a
// client wrote matters where it reaches a model, e.g. a tool's JSON Schema).
absl::StatusOr<nlohmann::ordered_json> ParseOrderedJsonStrict(std::string_view text);

// Reads and parses a JSON file of at most `max_bytes` bytes. Errors start
// with the path: NOT_FOUND when it cannot be opened, INVALID_ARGUMENT when it
// is not a regular file, too large, or not valid JSON (see ParseJsonStrict).
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path,
                                            uint64_t max_bytes = 64u << 20);

// Short description of a JSON value's type for error messages ("string",
// "integer", "number", "boolean", "null", "array", "object").
std::string_view JsonTypeName(const nlohmann::json& value);
std::string_view JsonTypeName(const nlohmann::ordered_json& value);
std::string_view JsonTypeName(nlohmann::json::value_t type);

}  // namespace tessera
