#pragma once

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dispatchd::store {

// Maps an exception thrown by libpqxx (or std::) to a Status whose code says what the caller should
// do next; `what` names the operation and prefixes the message ("claim jobs: ...").
//   serialization_failure, deadlock_detected   -> Aborted (retry the whole transaction)
//   broken_connection (and too_many_connections) -> Unavailable
//   sql_error with SQLSTATE 08xxx or 57P0x       -> Unavailable (the server went away)
//   unique_violation                           -> AlreadyExists
//   in_doubt_error, statement_completion_unknown -> Unknown (re-read before retrying)
//   any other sql_error                        -> Internal, with the SQLSTATE
//   anything else                              -> Internal
// Messages carry the server's error text, never the connection string.
absl::Status TranslatePgError(const std::exception& e, absl::string_view what);

}  // namespace dispatchd::store
