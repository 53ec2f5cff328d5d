#include "server/store/pg_leader_lease.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pqxx/connection"
#include "pqxx/except"
#include "pqxx/nontransaction"
#include "pqxx/notification"
#include "pqxx/transaction"

#include "lib/util/status_macros.h"
#include "server/store/migrations.h"
#include "server/store/pg_conninfo.h"
#include "server/store/pg_error.h"
#include "server/store/pg_pool.h"

namespace dispatchd::store {
namespace {

constexpr char kChannel[] = "dispatchd_jobs";
// A leader that steps down on purpose announces it here, so standbys try the lock at once.
constexpr char kLeaderChannel[] = "dispatchd_leader";

constexpr char kTryLock[] = "SELECT pg_try_advisory_lock($1::int8)";
constexpr char kUnlock[] = "SELECT pg_advisory_unlock($1::int8)";
// $1 holder, $2 address. The epoch is a key column (migration 10), so this locks the row FOR
// UPDATE: it waits for the writes in flight that still carry the old epoch (they lock the row
// FOR KEY SHARE) and holds off new ones until it commits, so none can land after it.
constexpr char kBumpEpoch[] = R"sql(
UPDATE dispatchd_leader SET epoch = epoch + 1, holder = $1, address = $2, renewed_at = now()
WHERE id = 1 RETURNING epoch)sql";
constexpr char kRenew[] =
    "UPDATE dispatchd_leader SET renewed_at = now() WHERE id = 1 AND epoch = $1::int8";
constexpr char kRead[] = R"sql(
SELECT epoch, holder, address, (extract(epoch FROM now() - renewed_at) * 1000000)::int8
FROM dispatchd_leader WHERE id = 1)sql";
// $1 epoch. The record names no address until the next leader's bump: nobody is sent to a
// daemon that has stopped leading.
constexpr char kReleased[] =
    "UPDATE dispatchd_leader SET address = '' WHERE id = 1 AND epoch = $1::int8";
constexpr char kEvict[] = R"sql(
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid())sql";

}  // namespace

class PgLeaderLease::Impl {
 public:
  // Collects the payloads of notifications delivered while the connection is polled.
  class Receiver final : public pqxx::notification_receiver {
   public:
    Receiver(pqxx::connection_base& conn, const char* channel, std::vector<std::string>* sink)
        : pqxx::notification_receiver(conn, channel), sink_(sink) {}
    void operator()(const std::string& payload, int /*backend_pid*/) override {
      sink_->push_back(payload);
    }

   private:
    std::vector<std::string>* sink_;
  };

  Impl(std::unique_ptr<pqxx::connection> conn, std::string endpoint)
      : conn_(std::move(conn)), endpoint_(std::move(endpoint)) {}

  // Runs `body` and translates any exception, naming `what`.
  template <typename Body>
  auto Guard(const char* what, Body&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const std::exception& e) {
      return TranslatePgError(e, absl::StrCat("leader lease (", endpoint_, "): ", what));
    }
  }

  std::unique_ptr<pqxx::connection> conn_;
  std::string endpoint_;
  std::vector<std::string> pending_;
  std::unique_ptr<Receiver> receiver_;
  std::vector<std::string> releases_;  // payloads on kLeaderChannel
  std::unique_ptr<Receiver> release_receiver_;
};

PgLeaderLease::PgLeaderLease(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PgLeaderLease::~PgLeaderLease() {
  if (impl_ == nullptr) return;
  try {
    impl_->receiver_.reset();
    impl_->release_receiver_.reset();
    impl_->conn_.reset();  // ends the session: PostgreSQL frees the lock
  } catch (...) {
  }
}

absl::StatusOr<std::unique_ptr<PgLeaderLease>> PgLeaderLease::Connect(
    const std::string& url, const std::string& application_name, absl::Duration connect_timeout,
    absl::Duration statement_timeout) {
  absl::StatusOr<Target> target =
      ParseTarget(url, connect_timeout, application_name, /*tcp_user_timeout=*/statement_timeout);
  if (!target.ok()) return target.status();
  // A session of its own, opened as the store opens its pooled ones but never taken from or
  // given back to a pool: the advisory lock is held by the session, so the session must live
  // exactly as long as the lease, and end (freeing the lock) when an error drops the lease.
  DISPATCHD_ASSIGN_OR_RETURN(std::unique_ptr<pqxx::connection> conn, OpenConnection(*target));
  try {
    // libpqxx 6 would quietly open a new session when this one breaks, and the new session does
    // not hold the lock: a lease must see the break instead.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    conn->inhibit_reactivation(true);
#pragma GCC diagnostic pop
    {
      // No statement may hold the election up for long: a leader that cannot renew in time must
      // notice and step down before a standby takes over.
      pqxx::nontransaction txn(*conn);
      txn.exec(absl::StrCat("SET statement_timeout = ",
                            std::max<int64_t>(1, absl::ToInt64Milliseconds(statement_timeout))));
    }
    return std::unique_ptr<PgLeaderLease>(
        new PgLeaderLease(std::make_unique<Impl>(std::move(conn), target->endpoint)));
  } catch (const std::exception& e) {
    return TranslatePgError(e, absl::StrCat("postgres: cannot connect to ", target->endpoint));
  }
}

absl::StatusOr<std::optional<int64_t>> PgLeaderLease::TryAcquire(const std::string& holder,
                                                                 const std::string& address,
                                                                 absl::Duration bump_timeout) {
  return impl_->Guard("acquire", [&]() -> absl::StatusOr<std::optional<int64_t>> {
    {
      pqxx::nontransaction txn(*impl_->conn_);
      if (!txn.exec_params(kTryLock, kLeaderLockKey)[0][0].as<bool>()) return std::nullopt;
    }
    try {
      pqxx::work txn(*impl_->conn_);
      txn.exec(absl::StrCat("SET LOCAL lock_timeout = ",
                            std::max<int64_t>(1, absl::ToInt64Milliseconds(bump_timeout))));
      const int64_t epoch = txn.exec_params(kBumpEpoch, holder, address)[0][0].as<int64_t>();
      txn.commit();
      return epoch;
    } catch (const std::exception&) {
      // Lock timeout (the old leader's writes still hold the row) or a broken session: give the
      // lock back so the next try starts clean.
      try {
        pqxx::nontransaction txn(*impl_->conn_);
        txn.exec_params(kUnlock, kLeaderLockKey);
      } catch (...) {
      }
      throw;
    }
  });
}

absl::Status PgLeaderLease::Renew(int64_t epoch) {
  return impl_->Guard("renew", [&]() -> absl::Status {
    pqxx::nontransaction txn(*impl_->conn_);
    if (txn.exec_params(kRenew, epoch).affected_rows() == 1) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " is over: another daemon became the leader"));
  });
}

absl::StatusOr<LeaderRecord> PgLeaderLease::Read() {
  return impl_->Guard("read", [&]() -> absl::StatusOr<LeaderRecord> {
    pqxx::nontransaction txn(*impl_->conn_);
    pqxx::result rows = txn.exec(kRead);
    if (rows.empty()) return absl::InternalError("dispatchd_leader has no row");
    return LeaderRecord{.epoch = rows[0][0].as<int64_t>(),
                        .holder = rows[0][1].as<std::string>(),
                        .address = rows[0][2].as<std::string>(),
                        .since_renewal = absl::Microseconds(rows[0][3].as<int64_t>())};
  });
}

absl::StatusOr<int> PgLeaderLease::Evict(const std::string& application_name) {
  return impl_->Guard("evict", [&]() -> absl::StatusOr<int> {
    pqxx::nontransaction txn(*impl_->conn_);
    return txn.exec_params(kEvict, application_name)[0][0].as<int>();
  });
}

absl::Status PgLeaderLease::Listen() {
  return impl_->Guard("listen", [&]() -> absl::Status {
    if (impl_->receiver_ == nullptr) {
      impl_->receiver_ =
          std::make_unique<Impl::Receiver>(*impl_->conn_, kChannel, &impl_->pending_);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> PgLeaderLease::AwaitNotifications(absl::Duration timeout) {
  return impl_->Guard("await notifications", [&]() -> absl::StatusOr<std::vector<std::string>> {
    if (!impl_->conn_->is_open()) return absl::UnavailableError("session closed");
    if (impl_->pending_.empty()) {
      const int64_t us = std::max<int64_t>(0, absl::ToInt64Microseconds(timeout));
      impl_->conn_->await_notification(static_cast<long>(us / 1000000),
                                       static_cast<long>(us % 1000000));
    }
    impl_->conn_->get_notifs();
    std::vector<std::string> out;
    out.swap(impl_->pending_);
    return out;
  });
}

absl::Status PgLeaderLease::Release(int64_t epoch) {
  return impl_->Guard("release", [&]() -> absl::Status {
    {
      pqxx::nontransaction txn(*impl_->conn_);
      txn.exec_params(kUnlock, kLeaderLockKey);
    }
    // After the unlock: a standby woken by the notification finds the lock free.
    pqxx::work txn(*impl_->conn_);
    txn.exec_params(kReleased, epoch);
    txn.exec(absl::StrCat("NOTIFY ", kLeaderChannel, ", '", epoch, "'"));
    txn.commit();
    return absl::OkStatus();
  });
}

absl::Status PgLeaderLease::ListenForRelease() {
  return impl_->Guard("listen", [&]() -> absl::Status {
    if (impl_->release_receiver_ == nullptr) {
      impl_->release_receiver_ =
          std::make_unique<Impl::Receiver>(*impl_->conn_, kLeaderChannel, &impl_->releases_);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<bool> PgLeaderLease::AwaitRelease(absl::Duration timeout) {
  return impl_->Guard("await release", [&]() -> absl::StatusOr<bool> {
    if (!impl_->conn_->is_open()) return absl::UnavailableError("session closed");
    if (impl_->releases_.empty()) {
      const int64_t us = std::max<int64_t>(0, absl::ToInt64Microseconds(timeout));
      impl_->conn_->await_notification(static_cast<long>(us / 1000000),
                                       static_cast<long>(us % 1000000));
    }
    impl_->conn_->get_notifs();
    const bool released = !impl_->releases_.empty();
    impl_->releases_.clear();
    return released;
  });
}

}  // namespace dispatchd::store
