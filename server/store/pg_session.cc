#include "server/store/pg_session.h"

#include <string>
#include <vector>

#include "pqxx/connection"
#include "pqxx/nontransaction"

#include "server/store/pg_statements.h"

namespace dispatchd::store {

void PrepareSession(pqxx::connection& conn) {
  {
    pqxx::nontransaction txn(conn);
    txn.exec(kPinPointPlans);
  }
  for (const Statement& s : kAllStatements) {
    conn.prepare(s.name, s.sql);
    conn.prepare_now(s.name);  // one round trip each, once per connection
  }
}

std::vector<PreparedStatementName> PreparedStatementNames() {
  std::vector<PreparedStatementName> out;
  for (const Statement& s : kAllStatements) {
    out.push_back({.name = s.name, .scans = s.access == Access::kScan});
  }
  return out;
}

}  // namespace dispatchd::store
