#include "server/store/pg_pool.h"

#include "pqxx/except"

#include "server/store/pg_session.h"

namespace dispatchd::store {

absl::StatusOr<std::unique_ptr<pqxx::connection>> OpenConnection(const Target& target) {
  try {
    return std::make_unique<pqxx::connection>(target.conninfo);
  } catch (const std::exception& e) {
    return TranslatePgError(e, absl::StrCat("postgres: cannot connect to ", target.endpoint));
  }
}

absl::Status PrepareStatements(pqxx::connection& conn, const Target& target) {
  try {
    PrepareSession(conn);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return TranslatePgError(e, absl::StrCat("postgres ", target.endpoint, ": prepare statements"));
  }
}

absl::StatusOr<std::unique_ptr<pqxx::connection>> OpenPrepared(const Target& target) {
  DISPATCHD_ASSIGN_OR_RETURN(std::unique_ptr<pqxx::connection> conn, OpenConnection(target));
  DISPATCHD_RETURN_IF_ERROR(PrepareStatements(*conn, target));
  return conn;
}

bool IsBroken(const std::exception& e, const pqxx::connection& conn) {
  return dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr ||
         dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr ||
         dynamic_cast<const pqxx::statement_completion_unknown*>(&e) != nullptr || !conn.is_open();
}

ConnectionPool::ConnectionPool(Target target, int size,
                               std::vector<std::unique_ptr<pqxx::connection>> conns)
    : target_(std::move(target)), size_(size), open_(static_cast<int>(conns.size())) {
  idle_ = std::move(conns);
}

absl::StatusOr<ConnectionPool::Lease> ConnectionPool::Checkout() {
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &ConnectionPool::CanCheckout));
    if (!idle_.empty()) {
      std::unique_ptr<pqxx::connection> conn = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(conn));
    }
    ++open_;  // reserve the slot while connecting outside the lock
  }
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = OpenPrepared(target_);
  if (!conn.ok()) {
    absl::MutexLock l(&mu_);
    --open_;
    return conn.status();
  }
  return Lease(this, *std::move(conn));
}

bool ConnectionPool::CanCheckout() const { return !idle_.empty() || open_ < size_; }

void ConnectionPool::Return(std::unique_ptr<pqxx::connection> conn, bool broken) {
  if (broken) conn.reset();  // closes outside the lock
  absl::MutexLock l(&mu_);
  if (broken) {
    --open_;
  } else {
    idle_.push_back(std::move(conn));
  }
}

}  // namespace dispatchd::store
