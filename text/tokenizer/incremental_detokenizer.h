// IncrementalDetokenizer: turns a stream of generated token ids into text
// deltas for streaming responses.
//
// Each delta is valid UTF-8 and never ends inside a character: bytes of a
// character split across tokens are held back until the character is
// complete. Bytes that can no longer become valid become U+FFFD as soon as
// that is certain, and Finish() turns an incomplete tail into U+FFFD, so the
// concatenated deltas always equal Tokenizer::Decode of the same ids (with
// its default clean_up_tokenization_spaces=false).
//
// Thread-safety: one instance belongs to one stream; it is not safe to use
// from several threads at once. Several instances may share one Tokenizer.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera {

class IncrementalDetokenizer {
 public:
  // REQUIRES: `tokenizer` outlives this object.
  explicit IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens = false);

  // Feeds one id and returns the text that became final (possibly empty).
  // INVALID_ARGUMENT for an id outside the vocabulary; the stream is then
  // unchanged and may continue.
  absl::StatusOr<std::string> Add(int32_t id);

  // Ends the stream: returns what is left (U+FFFD for an incomplete
  // character). The detokenizer may be reused for a new stream afterwards.
  std::string Finish();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }
  // Number of ids accepted so far in this stream.
  size_t num_tokens() const { return num_tokens_; }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
  size_t num_tokens_ = 0;
};

}  // namespace tessera
