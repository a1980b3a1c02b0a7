// Pre-tokenization: cuts normalized text into the pieces ("words") that BPE
// encodes independently. Implements the Hugging Face tokenizer.json
// pre-tokenizers used by byte-level BPE models: `Split` with a regular
// expression (Qwen2/Qwen3, Llama-3) and `ByteLevel` (GPT-2 style: optional
// prefix space and optional built-in regex), chained by `Sequence`.
//
// Patterns are read from tokenizer.json and compiled with PCRE2 in UTF + UCP
// mode (so \p{L}, \p{N}, \s and case-insensitive groups follow Unicode), with
// JIT compilation when the library supports it. Before compiling, `\s` and
// `\S` are rewritten to the exact Unicode White_Space set, which is what the
// reference implementation (Oniguruma inside Hugging Face tokenizers) uses;
// PCRE2's own \s differs by one code point (U+180E).
//
// Thread-safety: RegexSplitter and PreTokenizer are immutable after
// construction; Split/Run may be called from any number of threads at once.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera::tokenizer {

// What Split does with the pattern's matches (Hugging Face
// SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,            // Matches and the text between them are separate pieces.
  kRemoved,             // Matches are dropped.
  kMergedWithPrevious,  // A match is appended to the piece before it.
  kMergedWithNext,      // A match is prepended to the piece after it.
  kContiguous,          // Adjacent matches form one piece.
};

// Parses "Isolated", "Removed", ... (case-insensitive).
absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name);

// Rewrites `\s` and `\S` in a regular expression to explicit White_Space
// classes (inside character classes too). Everything else is copied as is.
std::string RewriteWhitespaceEscapes(std::string_view pattern);

// The GPT-2 pattern applied by a ByteLevel pre-tokenizer with use_regex=true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One compiled Split pre-tokenizer.
class RegexSplitter {
 public:
  // Compiles `pattern`; INVALID_ARGUMENT names the PCRE2 error and offset.
  // With `invert`, the matches are the pieces and the text between them the
  // delimiters.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(std::string_view pattern,
                                                               SplitBehavior behavior,
                                                               bool invert = false);
  // A splitter that matches a literal string (tokenizer.json {"String": ...}).
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> CreateLiteral(std::string_view literal,
                                                                      SplitBehavior behavior,
                                                                      bool invert = false);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the non-empty pieces of `text` (views into it) to *pieces.
  // REQUIRES: `text` is valid UTF-8. Fails only when PCRE2 gives up (match
  // or stack limits), with RESOURCE_EXHAUSTED.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

  bool jit_compiled() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  struct Scratch;
  struct Code;
  RegexSplitter(std::string pattern, SplitBehavior behavior, bool invert, Code* code, bool jit);

  Scratch* AcquireScratch() const;
  void ReleaseScratch(Scratch* scratch) const;

  const std::string pattern_;
  const SplitBehavior behavior_;
  const bool invert_;
  Code* const code_;
  const bool jit_;
  mutable absl::Mutex mu_;
  mutable std::vector<Scratch*> free_scratch_ ABSL_GUARDED_BY(mu_);
};

// A chain of pre-tokenization steps applied to every normalized section.
class PreTokenizer {
 public:
  PreTokenizer() = default;

  // Appends a Split step.
  void AddSplit(std::unique_ptr<RegexSplitter> splitter);
  // Appends a ByteLevel step: prefixes a space to each piece that does not
  // start with one (when add_prefix_space), then splits with `splitter`
  // (the GPT-2 pattern for use_regex=true; null for use_regex=false).
  void AddByteLevel(bool add_prefix_space, std::unique_ptr<RegexSplitter> splitter);

  bool has_byte_level() const { return has_byte_level_; }
  bool empty() const { return steps_.empty(); }

  // Appends the pieces of `text` to *pieces. Pieces are views into `text` or
  // into strings appended to *storage (which must outlive their use).
  // REQUIRES: `text` is valid UTF-8.
  absl::Status Run(std::string_view text, std::vector<std::string_view>* pieces,
                   std::deque<std::string>* storage) const;

 private:
  struct Step {
    bool byte_level = false;
    bool add_prefix_space = false;
    std::unique_ptr<RegexSplitter> splitter;  // May be null for ByteLevel.
  };
  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace tessera::tokenizer
