// Bridges std::string_view (used in Tessera's interfaces) and
// absl::string_view, which the Debian build of Abseil keeps as a separate
// type, so absl::StrCat and heterogeneous hash-map lookups accept both.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace tessera::tokenizer {

inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }
inline std::string_view StdView(absl::string_view s) { return {s.data(), s.size()}; }

}  // namespace tessera::tokenizer
