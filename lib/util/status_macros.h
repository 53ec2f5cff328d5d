#pragma once

// Propagation macros for absl::Status and absl::StatusOr (abseil ships its own only from LTS
// 20260526; these have the same spelling so an upgrade is a rename).

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DISPATCHD_STATUS_CONCAT_INNER_(a, b) a##b
#define DISPATCHD_STATUS_CONCAT_(a, b) DISPATCHD_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define DISPATCHD_RETURN_IF_ERROR(expr)                                     \
  do {                                                                      \
    if (absl::Status _dispatchd_status = (expr); !_dispatchd_status.ok()) { \
      return _dispatchd_status;                                             \
    }                                                                       \
  } while (false)

// Declares or assigns `lhs` from the value of the StatusOr `expr`, or returns its status.
#define DISPATCHD_ASSIGN_OR_RETURN(lhs, expr)                                                     \
  DISPATCHD_ASSIGN_OR_RETURN_IMPL_(DISPATCHD_STATUS_CONCAT_(_dispatchd_statusor_, __LINE__), lhs, \
                                   expr)

#define DISPATCHD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = *std::move(statusor)
