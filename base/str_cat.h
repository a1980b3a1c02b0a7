// Cat(): string concatenation that accepts std::string_view. The system's
// absl is built with its own absl::string_view (not an alias of
// std::string_view), so absl::StrCat rejects std::string_view arguments;
// Cat forwards everything else (numbers, absl::string_view) to absl::StrCat.
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace str_cat_internal {

template <typename T>
void Append(std::string* out, const T& value) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out->append(std::string_view(value));
  } else {
    absl::StrAppend(out, value);
  }
}

}  // namespace str_cat_internal

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (str_cat_internal::Append(&out, args), ...);
  return out;
}

}  // namespace tessera
