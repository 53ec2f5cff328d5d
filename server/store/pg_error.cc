#include "server/store/pg_error.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "pqxx/except"

namespace dispatchd::store {
namespace {

// libpq messages span lines ("...failed: Connection refused\n\tIs the server running..."); a
// Status message reads better on one.
std::string OneLine(absl::string_view text) {
  std::string s = absl::StrReplaceAll(text, {{"\r", " "}, {"\n", " "}, {"\t", " "}});
  absl::RemoveExtraAsciiWhitespace(&s);
  return s;
}

}  // namespace

absl::Status TranslatePgError(const std::exception& e, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", OneLine(e.what()));
  if (dynamic_cast<const pqxx::serialization_failure*>(&e) != nullptr ||
      dynamic_cast<const pqxx::deadlock_detected*>(&e) != nullptr) {
    return absl::AbortedError(message);
  }
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr) {
    return absl::UnavailableError(message);
  }
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr ||
      dynamic_cast<const pqxx::statement_completion_unknown*>(&e) != nullptr) {
    return absl::UnknownError(message);
  }
  if (dynamic_cast<const pqxx::unique_violation*>(&e) != nullptr) {
    return absl::AlreadyExistsError(message);
  }
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e); sql != nullptr) {
    // Class 08 (connection exception) and 57P01..57P03 (server shutting down or starting up)
    // mean the server went away, whatever exception type libpqxx picked for them.
    const absl::string_view state = sql->sqlstate();
    if (absl::StartsWith(state, "08") || absl::StartsWith(state, "57P")) {
      return absl::UnavailableError(absl::StrCat(message, " (SQLSTATE ", state, ")"));
    }
    return absl::InternalError(absl::StrCat(message, " (SQLSTATE ", sql->sqlstate(), ")"));
  }
  return absl::InternalError(message);
}

}  // namespace dispatchd::store
