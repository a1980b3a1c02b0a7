// RETURN_IF_ERROR: returns the status of a failed absl::Status expression
// from the enclosing function (which returns absl::Status or StatusOr<T>).
//
// Thread-safety: a macro; no state.
#pragma once

#include "absl/status/status.h"

#define RETURN_IF_ERROR(expr)                             \
  do {                                                    \
    if (absl::Status status_ = (expr); !status_.ok()) {   \
      return status_;                                     \
    }                                                     \
  } while (0)
