#include "services/router/request_checks.h"

#include <algorithm>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tessera::services {

absl::Status CheckModelName(absl::string_view requested, absl::string_view served) {
  if (requested.empty() || requested == served) return absl::OkStatus();
  // The name is the client's: echo a bounded piece of it, so that the error
  // fits in any metadata limit.
  constexpr size_t kEchoed = 128;
  std::string shown =
      requested.size() <= kEchoed
          ? std::string(requested)
          : absl::StrCat(requested.substr(0, kEchoed), "... (", requested.size(), " bytes)");
  return absl::NotFoundError(absl::StrCat("model '", absl::CHexEscape(shown),
                                          "' is not served here; this cluster serves '", served,
                                          "'"));
}

absl::Status CheckPromptBytes(size_t bytes, size_t max_prompt_bytes, int64_t context,
                              const Tokenizer* tokenizer) {
  const size_t per_token = tokenizer ? tokenizer->max_bytes_per_token() : 0;
  size_t limit = max_prompt_bytes;
  if (per_token > 0 && context > 0) {
    const size_t derived =
        static_cast<size_t>(context) * per_token * (tokenizer->normalizes_nfc() ? 3 : 1);
    limit = limit == 0 ? derived : std::min(limit, derived);
  }
  if (limit == 0 || bytes <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the prompt is ", bytes, " bytes, more than the ", limit,
                   " bytes that can fit in the model's context of ", context,
                   " tokens (or --max_prompt_bytes); shorten it"));
}

}  // namespace tessera::services
