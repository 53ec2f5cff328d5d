#pragma once

// PgJobStore's connections: how a session is opened (the one place that translates a failure to
// connect), the pool its calls check connections out of, and WithConnection, which runs a call on
// a pooled connection and translates what it throws. Internal to server/store.

#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "pqxx/connection"

#include "lib/util/status_macros.h"
#include "server/store/pg_conninfo.h"
#include "server/store/pg_error.h"

namespace dispatchd::store {

// Opens a session on `target` (no statements prepared). Unavailable names the endpoint.
absl::StatusOr<std::unique_ptr<pqxx::connection>> OpenConnection(const Target& target);

// PrepareSession (pg_session.h) on `conn`, translated: a schema that does not match fails at
// Connect rather than on first use.
absl::Status PrepareStatements(pqxx::connection& conn, const Target& target);

// OpenConnection, then PrepareStatements: a connection ready for the store's calls.
absl::StatusOr<std::unique_ptr<pqxx::connection>> OpenPrepared(const Target& target);

// True if, after `e` was thrown from a call on `conn`, the connection cannot be trusted for the
// next call.
bool IsBroken(const std::exception& e, const pqxx::connection& conn);

// A fixed-size set of prepared connections. Checkout hands one connection to one caller; the
// lease returns it when destroyed. A lease marked broken drops its connection, and a later
// checkout opens a replacement.
//
//   absl::StatusOr<ConnectionPool::Lease> lease = pool.Checkout();
//
// Thread-safe; a Lease is used by one thread.
class ConnectionPool {
 public:
  class Lease {
   public:
    Lease(ConnectionPool* pool, std::unique_ptr<pqxx::connection> conn)
        : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          conn_(std::move(other.conn_)),
          broken_(other.broken_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->Return(std::move(conn_), broken_);
    }

    pqxx::connection& conn() { return *conn_; }
    void MarkBroken() { broken_ = true; }

   private:
    ConnectionPool* pool_;
    std::unique_ptr<pqxx::connection> conn_;
    bool broken_ = false;
  };

  // `conns`: connections already open and prepared, at most `size`; more are opened on demand.
  ConnectionPool(Target target, int size, std::vector<std::unique_ptr<pqxx::connection>> conns);

  // Waits for an idle connection, or opens one if fewer than `size` are open. Unavailable if a
  // replacement cannot be opened.
  absl::StatusOr<Lease> Checkout() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool CanCheckout() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(std::unique_ptr<pqxx::connection> conn, bool broken) ABSL_LOCKS_EXCLUDED(mu_);

  const Target target_;
  const int size_;

  absl::Mutex mu_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_);  // idle + leased + being opened
};

// Runs `body(conn)` on a pooled connection: the one place where PgJobStore catches, so every
// public call translates exceptions exactly once and no exception leaves the store. `what` names
// the call in messages.
template <typename Body>
auto WithConnection(ConnectionPool& pool, absl::string_view what, Body&& body)
    -> decltype(body(std::declval<pqxx::connection&>())) {
  DISPATCHD_ASSIGN_OR_RETURN(ConnectionPool::Lease lease, pool.Checkout());
  try {
    return body(lease.conn());
  } catch (const std::exception& e) {
    if (IsBroken(e, lease.conn())) lease.MarkBroken();
    return TranslatePgError(e, what);
  } catch (...) {
    lease.MarkBroken();
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

}  // namespace dispatchd::store
