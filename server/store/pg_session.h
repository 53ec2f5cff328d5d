#pragma once

#include <string>
#include <vector>

#include "pqxx/connection"

namespace dispatchd::store {

// The session each of PgJobStore's connections runs in, exposed so that tests can open one of
// their own and check the plans its statements get.
//
// Readies `conn` as the store's: pins its planner to point plans (no sequential or bitmap scans,
// no hash or merge joins), so that a plan made while jobs_active was small never reads the whole
// table once the queue has grown, and prepares every statement under its name. Statements that
// must read a whole table run in a transaction of their own that gives the planner its plans
// back. Throws what libpqxx throws.
void PrepareSession(pqxx::connection& conn);

// The statements PrepareSession prepares: each one's name, and whether it reads every row of a
// table or a partial index (planned freely) rather than rows named by key or a bounded index
// range (planned under the pin).
struct PreparedStatementName {
  std::string name;
  bool scans = false;
};
std::vector<PreparedStatementName> PreparedStatementNames();

}  // namespace dispatchd::store
