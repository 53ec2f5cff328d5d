#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "pqxx/connection"

namespace dispatchd::store {

// One schema change. Versions are applied in ascending order, each at most once per database.
struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements, no parameters
};

// Every migration dispatchd knows, ascending by version.
absl::Span<const Migration> AllMigrations();

// Key of the transaction-scoped advisory lock that serializes migrations, so that daemons starting
// at once on one database do not race. Distinct from every other advisory lock dispatchd takes.
inline constexpr int64_t kMigrationLockKey = 0x64'69'73'70'6d'69'67'72;  // "dispmigr"

// Key of the session-scoped advisory lock the leading daemon holds (pg_leader_lease.h).
inline constexpr int64_t kLeaderLockKey = 0x64'69'73'70'6c'65'61'64;  // "displead"

// Brings the schema of `conn`'s database up to the newest version: in one transaction, under
// pg_advisory_xact_lock(kMigrationLockKey), applies each migration newer than the highest version
// in schema_migrations and records it there. Idempotent. A database already migrated past the
// newest version this binary knows is left alone: migrations are additive, so an older daemon keeps
// working during a rolling upgrade.
// REQUIRES: `conn` is not in a transaction. Errors are translated (pg_error.h).
absl::Status ApplyMigrations(pqxx::connection& conn);

}  // namespace dispatchd::store
