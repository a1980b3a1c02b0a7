// RETURN_IF_ERROR and ASSIGN_OR_RETURN, for functions returning
// absl::Status or absl::StatusOr<T>. RETURN_IF_ERROR(expr) returns the
// status of a failed absl::Status expression.
//
// Thread-safety: a macro; no state.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RETURN_IF_ERROR(expr)                           \
  do {                                                  \
    if (absl::Status status_ = (expr); !status_.ok()) { \
      return status_;                                   \
    }                                                   \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the absl::StatusOr<T> `expr`;
// returns its status when it failed, else moves its value into `lhs` (a
// declaration such as `auto x` or an existing variable).
#define TESSERA_STATUS_CONCAT_INNER_(a, b) a##b
#define TESSERA_STATUS_CONCAT_(a, b) TESSERA_STATUS_CONCAT_INNER_(a, b)
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TESSERA_STATUS_CONCAT_(statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(*tmp)
