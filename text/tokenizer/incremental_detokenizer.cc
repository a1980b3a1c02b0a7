#include "text/tokenizer/incremental_detokenizer.h"

#include "absl/strings/str_cat.h"
#include "text/tokenizer/utf8.h"

namespace tessera {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  const TokenPiece* piece = tokenizer_->Piece(id);
  if (piece == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is not in the vocabulary (size ", tokenizer_->vocab_size(), ")"));
  }
  ++num_tokens_;
  std::string delta;
  if (piece->special && skip_special_tokens_) return delta;
  if (piece->added) {
    // As in Decode: a byte run ends at an added token.
    tokenizer::AppendUtf8Lossy(pending_, /*final=*/true, &delta);
    pending_.clear();
    delta.append(piece->text);
    return delta;
  }
  pending_.append(piece->text);
  const size_t consumed = tokenizer::AppendUtf8Lossy(pending_, /*final=*/false, &delta);
  pending_.erase(0, consumed);
  return delta;
}

std::string IncrementalDetokenizer::Finish() {
  std::string delta;
  tokenizer::AppendUtf8Lossy(pending_, /*final=*/true, &delta);
  pending_.clear();
  num_tokens_ = 0;
  return delta;
}

}  // namespace tessera
