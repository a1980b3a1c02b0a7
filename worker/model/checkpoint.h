// Checkpoint: the tensors of one model, from a single safetensors file or a
// sharded set described by `model.safetensors.index.json`.
//
// Index rules (all errors name the index file and the offending tensor or
// shard):
//   - the index is a JSON object (no duplicate keys) with a "weight_map"
//     object mapping each tensor name to a shard file name; other top-level
//     keys ("metadata") are ignored;
//   - a shard name is a plain file name in the index's directory: non-empty,
//     no '/', '\\' or NUL, not "." or ".." (no path escapes);
//   - every shard the index names must exist and pass SafetensorsFile's
//     validation; a missing shard is NOT_FOUND naming a tensor mapped to it;
//   - every tensor the index names must be in its shard (else NOT_FOUND);
//   - every tensor a shard holds must be mapped to that shard by the index
//     (a tensor held twice, or one the index does not know, is an error).
//
// Thread-safety: immutable after Open; const methods are safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/model/safetensors.h"
#include "worker/model/tensor.h"

namespace tessera::model {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSafetensorsSingleName = "model.safetensors";

class Checkpoint {
 public:
  // `path` is a model directory (uses model.safetensors.index.json when it
  // exists, else model.safetensors), an index file, or one .safetensors file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  // Opens a sharded checkpoint from its index file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenIndex(const std::string& index_path);

  // Wraps already opened files (tests, or callers that built images in memory).
  // Tensor names must be unique across files (else INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> FromFiles(
      std::vector<std::unique_ptr<SafetensorsFile>> files, std::string description);

  // What was opened: a file or an index path.
  const std::string& description() const { return description_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t num_tensors() const { return by_name_.size(); }

  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  // NOT_FOUND "<description>: no tensor named "x"" when absent.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  // All names, sorted.
  std::vector<std::string> TensorNames() const;

 private:
  Checkpoint() = default;

  std::string description_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string_view, const TensorView*> by_name_;
};

}  // namespace tessera::model
