// Tokenizer: loads a Hugging Face `tokenizer.json` (+ optional
// `tokenizer_config.json`) for byte-level BPE models such as Qwen2/Qwen3 and
// Llama-3, and encodes text to token ids and decodes ids back to text with
// the same results as Hugging Face tokenizers.
//
// Pipeline of Encode: UTF-8 validation -> added/special tokens matched in the
// raw text -> normalizer (NFC when the file asks for it) on the text between
// them -> added tokens marked "normalized" matched in that text -> the
// pre-tokenizer's regular expressions (PCRE2) cut it into words -> byte-level
// BPE per word (with a word cache) -> post-processor tokens (BOS/EOS) when
// add_special_tokens is set.
//
// Decode maps ids to bytes, decodes runs of byte-level tokens as UTF-8
// (invalid sequences become U+FFFD), inserts added tokens verbatim, and
// applies clean_up_tokenization_spaces only when asked to.
//
// Thread-safety: a Tokenizer is immutable after loading (the BPE word cache
// is internally synchronized); all const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/tokenizer/added_tokens.h"

namespace tessera {

namespace tokenizer {
class BpeModel;
class PreTokenizer;
}  // namespace tokenizer

struct EncodeOptions {
  // Add the tokens the model's post-processor asks for: the
  // TemplateProcessing of tokenizer.json, or else BOS/EOS when
  // tokenizer_config.json sets add_bos_token/add_eos_token. Same meaning and
  // default as Hugging Face's add_special_tokens. Pass false when the text
  // already carries them (e.g. a rendered chat template).
  bool add_special_tokens = true;
  // Do not recognize special tokens written in the text; encode them as
  // ordinary text instead (for untrusted input). Non-special added tokens
  // are still matched.
  bool split_special_tokens = false;
};

struct DecodeOptions {
  // Leave out special tokens (added tokens marked special, and the
  // additional_special_tokens of tokenizer_config.json).
  bool skip_special_tokens = false;
  // Remove spaces before punctuation and contractions (" ." -> ".", " 's" ->
  // "'s", ...). Off by default whatever tokenizer_config.json says: for
  // byte-level BPE the clean-up corrupts text ("a , b" cannot come back),
  // and transformers 5 ignores the setting for BPE tokenizers too.
  bool clean_up_tokenization_spaces = false;
};

// What one token id stands for when decoding.
struct TokenPiece {
  // Raw bytes for a byte-level vocabulary token (possibly a fragment of a
  // UTF-8 character); the literal content for an added token.
  std::string_view text;
  bool added = false;
  bool special = false;
};

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(std::string_view dir);
  // Loads the given files; an empty `tokenizer_config_path` means none.
  // Errors name the file: NOT_FOUND when a file cannot be read,
  // INVALID_ARGUMENT for malformed JSON (with its byte offset), unsupported
  // components (e.g. a model type other than BPE), or inconsistent contents
  // (e.g. a merge naming a token outside the vocabulary).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFiles(
      std::string_view tokenizer_json_path, std::string_view tokenizer_config_path = "");
  // Same from JSON text; `source` stands for the file name in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json = "",
      std::string_view source = "tokenizer.json");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes `text`. INVALID_ARGUMENT when `text` is not valid UTF-8 (the
  // message names the byte offset); RESOURCE_EXHAUSTED only if the regex
  // engine hits its limits on pathological input.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options = {}) const;

  // Decodes `ids`. INVALID_ARGUMENT names the position of an id that is not
  // in the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options = {}) const;

  // Token text as written in tokenizer.json (byte-level alphabet for BPE
  // tokens, e.g. "Ġhello"), and back.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // Decoding information for one id, or nullptr when it is not in the vocab.
  const TokenPiece* Piece(int32_t id) const;

  // Size of the id space: largest id (vocabulary or added token) + 1.
  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  bool IsSpecialToken(int32_t id) const;

  // From tokenizer_config.json (nullopt when not set or not in the vocab).
  std::optional<int32_t> bos_token_id() const { return bos_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_id_; }
  std::optional<int32_t> pad_token_id() const { return pad_id_; }
  bool add_bos_token() const { return add_bos_token_; }
  bool add_eos_token() const { return add_eos_token_; }
  // tokenizer_config.json's clean_up_tokenization_spaces, for callers that
  // want the older transformers behaviour (Decode does not apply it itself).
  bool config_clean_up_tokenization_spaces() const { return config_clean_up_; }
  // The default chat template (Jinja source), empty when there is none.
  const std::string& chat_template() const { return chat_template_; }
  // True when tokenizer.json asks for NFC normalization.
  bool normalizes_nfc() const { return nfc_; }
  // The most bytes of (normalized) text one token can stand for, so a text
  // of n bytes encodes to at least n / max_bytes_per_token() tokens (n / 3 of
  // that when NFC normalization may shrink the text first). 0 when no such
  // bound holds: bytes without a token are dropped or fused into one unk.
  size_t max_bytes_per_token() const { return max_bytes_per_token_; }
  const std::vector<tokenizer::AddedToken>& added_tokens() const { return added_; }
  // Ids that Encode(add_special_tokens=true) puts before/after the text.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }
  // True when the pre-tokenizer patterns were JIT-compiled by PCRE2.
  bool regex_jit() const { return regex_jit_; }
  // The BPE word cache's current size (for tests and metrics).
  size_t CachedWords() const;

 private:
  friend class TokenizerLoader;
  Tokenizer();

  absl::Status EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const;
  absl::Status EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<tokenizer::BpeModel> model_;
  std::unique_ptr<tokenizer::PreTokenizer> pre_tokenizer_;
  bool nfc_ = false;
  size_t max_bytes_per_token_ = 0;
  std::vector<tokenizer::AddedToken> added_;
  absl::flat_hash_map<std::string, int32_t> added_ids_;               // content -> id
  std::unique_ptr<tokenizer::AddedTokenMatcher> raw_matcher_;         // normalized == false
  std::unique_ptr<tokenizer::AddedTokenMatcher> normalized_matcher_;  // normalized == true
  std::vector<TokenPiece> pieces_;
  std::vector<bool> present_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
  bool add_bos_token_ = false;
  bool add_eos_token_ = false;
  bool config_clean_up_ = false;
  bool regex_jit_ = false;
  std::string chat_template_;
};

// The clean-up Hugging Face applies with clean_up_tokenization_spaces.
std::string CleanUpTokenizationSpaces(std::string_view text);

}  // namespace tessera
