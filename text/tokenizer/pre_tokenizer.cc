#include "text/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "text/tokenizer/string_util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace tessera::tokenizer {
namespace {

// The White_Space property as the body of a PCRE2 character class.
constexpr std::string_view kWhiteSpaceClassBody =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// JIT stack bounds per concurrent match. The patterns in use need little;
// the upper bound only matters for pathological inputs.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 1024 * 1024;
// Scratch objects kept for reuse between calls.
constexpr size_t kMaxPooledScratch = 64;

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

struct RegexSplitter::Scratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~Scratch() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(match_context);
    pcre2_jit_stack_free(jit_stack);
  }
};

absl::StatusOr<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AbslView(name));
  if (lower == "isolated") return SplitBehavior::kIsolated;
  if (lower == "removed") return SplitBehavior::kRemoved;
  if (lower == "mergedwithprevious") return SplitBehavior::kMergedWithPrevious;
  if (lower == "mergedwithnext") return SplitBehavior::kMergedWithNext;
  if (lower == "contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown split behavior \"", AbslView(name), "\""));
}

std::string RewriteWhitespaceEscapes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  bool quoted = false;  // Inside \Q...\E.
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (quoted) {
      if (c == '\\' && i + 1 < pattern.size() && pattern[i + 1] == 'E') {
        quoted = false;
        out += "\\E";
        ++i;
      } else {
        out += c;
      }
      continue;
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceClassBody;
        } else {
          absl::StrAppend(&out, "[", AbslView(kWhiteSpaceClassBody), "]");
        }
      } else if (e == 'S' && !in_class) {
        absl::StrAppend(&out, "[^", AbslView(kWhiteSpaceClassBody), "]");
      } else {
        // \S inside a class has no simple equivalent; PCRE2's is kept.
        if (e == 'Q') quoted = true;
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // POSIX class such as [:alpha:]: copy through its closing ":]".
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(std::string_view pattern,
                                                                     SplitBehavior behavior,
                                                                     bool invert) {
  std::string rewritten = RewriteWhitespaceEscapes(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot compile pre-tokenizer pattern \"%s\": %s at offset %d",
                        std::string(pattern), Pcre2ErrorMessage(error_code), error_offset));
  }
  auto* holder = new Code;
  holder->code = code;
  uint32_t jit_available = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &jit_available);
  const bool jit = jit_available != 0 && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  if (!jit) LogInfo("PCRE2 JIT unavailable; using the interpreter", {{"pattern", pattern}});
  return std::unique_ptr<RegexSplitter>(
      new RegexSplitter(std::move(rewritten), behavior, invert, holder, jit));
}

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::CreateLiteral(
    std::string_view literal, SplitBehavior behavior, bool invert) {
  if (literal.empty()) {
    return absl::InvalidArgumentError("pre-tokenizer split string is empty");
  }
  std::string quoted;
  for (char c : literal) {
    // Escape every ASCII punctuation character; others are literal already.
    if (absl::ascii_ispunct(static_cast<unsigned char>(c))) quoted += '\\';
    quoted += c;
  }
  return Create(quoted, behavior, invert);
}

RegexSplitter::RegexSplitter(std::string pattern, SplitBehavior behavior, bool invert, Code* code,
                             bool jit)
    : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert), code_(code), jit_(jit) {}

RegexSplitter::~RegexSplitter() {
  for (Scratch* s : free_scratch_) delete s;
  delete code_;
}

RegexSplitter::Scratch* RegexSplitter::AcquireScratch() const {
  {
    absl::MutexLock lock(&mu_);
    if (!free_scratch_.empty()) {
      Scratch* s = free_scratch_.back();
      free_scratch_.pop_back();
      return s;
    }
  }
  auto* s = new Scratch;
  s->match_data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  s->match_context = pcre2_match_context_create(nullptr);
  if (jit_) {
    s->jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    if (s->jit_stack != nullptr && s->match_context != nullptr) {
      pcre2_jit_stack_assign(s->match_context, nullptr, s->jit_stack);
    }
  }
  if (s->match_data == nullptr || s->match_context == nullptr) {
    delete s;
    return nullptr;
  }
  return s;
}

void RegexSplitter::ReleaseScratch(Scratch* scratch) const {
  absl::MutexLock lock(&mu_);
  if (free_scratch_.size() < kMaxPooledScratch) {
    free_scratch_.push_back(scratch);
  } else {
    delete scratch;
  }
}

absl::Status RegexSplitter::Split(std::string_view text,
                                  std::vector<std::string_view>* pieces) const {
  if (text.empty()) return absl::OkStatus();
  Scratch* scratch = AcquireScratch();
  if (scratch == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");

  // 1. Cover `text` with spans: matches and the gaps between them.
  std::vector<Span> spans;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  size_t prev_end = 0;
  uint32_t flags = PCRE2_NO_UTF_CHECK;  // Callers validate UTF-8 once up front.
  absl::Status status;
  while (offset <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), offset, flags, scratch->match_data,
                         scratch->match_context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Retry this one match with the interpreter, which uses the heap.
      rc = pcre2_match(code_->code, subject, text.size(), offset, flags | PCRE2_NO_JIT,
                       scratch->match_data, scratch->match_context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = absl::ResourceExhaustedError(
          absl::StrFormat("pre-tokenizer regex failed at byte offset %d of a %d-byte text: %s",
                          offset, text.size(), Pcre2ErrorMessage(rc)));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch->match_data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin < prev_end || end < begin) {
      // Only possible with \K or lookbehind tricks; not something to guess at.
      status = absl::InvalidArgumentError(absl::StrFormat(
          "pre-tokenizer pattern produced an out-of-order match [%d, %d)", begin, end));
      break;
    }
    if (begin > prev_end) spans.push_back({prev_end, begin, false});
    if (end > begin) {
      spans.push_back({begin, end, true});
      prev_end = end;
      offset = end;
      flags = PCRE2_NO_UTF_CHECK;
    } else {
      // Empty match: search again from the same place, refusing another
      // empty match there. Empty matches come at increasing offsets, and at
      // the end of the text the retry finds nothing, so this terminates.
      prev_end = begin;
      offset = begin;
      flags = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY_ATSTART;
    }
  }
  ReleaseScratch(scratch);
  if (!status.ok()) return status;
  if (prev_end < text.size()) spans.push_back({prev_end, text.size(), false});
  if (invert_) {
    for (Span& s : spans) s.is_match = !s.is_match;
  }

  // 2. Apply the delimiter behavior.
  auto emit = [&](size_t b, size_t e) {
    if (e > b) pieces->push_back(text.substr(b, e - b));
  };
  switch (behavior_) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) emit(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) emit(s.begin, s.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      std::vector<Span> merged;
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      for (const Span& s : merged) emit(s.begin, s.end);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<Span> merged;
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->begin, it->end);
      break;
    }
    case SplitBehavior::kContiguous: {
      std::vector<Span> merged;
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      for (const Span& s : merged) emit(s.begin, s.end);
      break;
    }
  }
  return absl::OkStatus();
}

void PreTokenizer::AddSplit(std::unique_ptr<RegexSplitter> splitter) {
  Step step;
  step.splitter = std::move(splitter);
  steps_.push_back(std::move(step));
}

void PreTokenizer::AddByteLevel(bool add_prefix_space, std::unique_ptr<RegexSplitter> splitter) {
  Step step;
  step.byte_level = true;
  step.add_prefix_space = add_prefix_space;
  step.splitter = std::move(splitter);
  steps_.push_back(std::move(step));
  has_byte_level_ = true;
}

absl::Status PreTokenizer::Run(std::string_view text, std::vector<std::string_view>* pieces,
                               std::deque<std::string>* storage) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string_view> current = {text};
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (step.add_prefix_space && piece.front() != ' ') {
        storage->push_back(absl::StrCat(" ", AbslView(piece)));
        piece = storage->back();
      }
      if (step.splitter == nullptr) {
        next.push_back(piece);
        continue;
      }
      if (absl::Status s = step.splitter->Split(piece, &next); !s.ok()) return s;
    }
    current.swap(next);
  }
  pieces->insert(pieces->end(), current.begin(), current.end());
  return absl::OkStatus();
}

}  // namespace tessera::tokenizer
