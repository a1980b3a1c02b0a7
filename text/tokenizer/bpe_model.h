// Byte-level BPE model: vocabulary, merge ranks and the merge loop that turns
// one pre-tokenized word (raw bytes) into token ids, plus a bounded cache of
// recent words.
//
// The merge loop repeatedly applies the lowest-ranked merge among adjacent
// symbol pairs, leftmost first on ties, as Hugging Face tokenizers do. It
// runs in O(n log n) per word with a heap, so very long words are safe.
//
// Thread-safety: immutable after Create() except for the internal cache,
// which is sharded and mutex-protected; EncodeWord may be called from any
// number of threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tessera::tokenizer {

struct BpeConfig {
  // Token text in the byte-level alphabet (as written in tokenizer.json) and
  // its id.
  std::vector<std::pair<std::string, int32_t>> vocab;
  // Merges in rank order (rank = index).
  std::vector<std::pair<std::string, std::string>> merges;
  // Token used for bytes that have no token of their own. Without it such
  // bytes are dropped (as Hugging Face tokenizers does).
  std::optional<std::string> unk_token;
  // Emit a word as one token when the vocabulary holds it whole (Llama-3).
  bool ignore_merges = false;
  // Collapse runs of unknown tokens into one.
  bool fuse_unk = false;
};

class WordCache;

class BpeModel {
 public:
  // Validates and indexes `config`. Errors (duplicate ids, merges naming
  // tokens outside the vocabulary, a merge result missing from it) are
  // INVALID_ARGUMENT and start with `source` (normally the file path).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(BpeConfig config,
                                                          std::string_view source);
  ~BpeModel();

  // Appends the ids of one word given as raw bytes.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Token text (byte-level alphabet), or nullptr for an id not in the vocab.
  const std::string* IdToToken(int32_t id) const;
  // The raw bytes a token stands for, or nullptr for an id not in the vocab.
  const std::string* IdToBytes(int32_t id) const;

  // Largest id in the vocabulary (-1 when empty) and number of entries.
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t size() const { return token_to_id_.size(); }
  size_t num_merges() const { return merges_.size(); }
  // Number of bytes 0..255 that have no single-byte token.
  int missing_byte_tokens() const;
  // Such bytes become the unk token (one each, or one per run when fused),
  // or are dropped without one.
  bool has_unk() const { return unk_id_ >= 0; }
  bool fuse_unk() const { return fuse_unk_; }

  // Words currently cached (for tests and metrics).
  size_t CachedWords() const;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  BpeModel();
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::vector<std::string> id_to_bytes_;
  std::vector<bool> id_present_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_id_;
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace tessera::tokenizer
