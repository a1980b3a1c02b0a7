// Early-return helpers for absl::Status / absl::StatusOr inside text/jinja.
//
// Thread-safety: macros only.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define JINJA_CONCAT_INNER_(a, b) a##b
#define JINJA_CONCAT_(a, b) JINJA_CONCAT_INNER_(a, b)

// Evaluates `expr` (a StatusOr<T>); returns its status on error, else moves
// the value into `lhs` (which may be a declaration).
#define JINJA_ASSIGN_OR_RETURN(lhs, expr) \
  JINJA_ASSIGN_OR_RETURN_IMPL_(JINJA_CONCAT_(jinja_statusor_, __LINE__), lhs, expr)
#define JINJA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)

// Evaluates `expr` (a Status); returns it on error.
#define JINJA_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status jinja_status_ = (expr);           \
    if (!jinja_status_.ok()) return jinja_status_;   \
  } while (0)
