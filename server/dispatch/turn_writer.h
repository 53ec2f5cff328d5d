#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::dispatch {

// What the store made of one turn's writes. Each kind has its status: when the turn as a whole
// fails for any reason but an unreachable database, each kind is tried on its own, so that one
// kind the database refuses (a row a trigger or constraint rejects) does not hold up the others.
struct TurnResult {
  absl::Status finishes, marks, claims, retries, returns;
  store::TurnOutcome out;
  // The first error among the kinds written (OK if none failed).
  absl::Status first_error() const;
};

// The dispatcher's one way to the store once it runs: every write it decides (claims, running
// marks, finishes, retries, returns, expiry, the fair-share accounts) and every read it needs
// (queue pages, the reconcile) goes through here, on threads of the writer's own, and comes back
// as a callback that the dispatcher posts to its loop. The loop thread never waits on the
// database.
//
//   TurnWriter writer(store);
//   writer.Commit(std::move(writes), [this](TurnResult r) { Post(... FinishTurn(r) ...); });
//
// Writes of one turn go in one transaction (store::JobStore::WriteTurn). Up to `threads` run at
// once, in no particular order among themselves: the caller keeps two writes of one row from
// being in flight together.
//
// Fencing: every write carries the term's fence (store::JobStore::SetFence). Once the store
// says the fence is broken (another daemon leads), the writer refuses every later write at once
// with the same status, without a round trip: nothing this term writes can land.
//
// Thread-safe. Callbacks run on the writer's threads and must not block.
class TurnWriter {
 public:
  TurnWriter(store::JobStore& store, int threads);
  // Runs what is queued, then joins.
  ~TurnWriter();
  TurnWriter(const TurnWriter&) = delete;
  TurnWriter& operator=(const TurnWriter&) = delete;

  // Writes one turn.
  void Commit(store::TurnWrites writes, absl::AnyInvocable<void(TurnResult) &&> done);

  // Expires the QUEUED jobs past their dispatch deadline (store::JobStore::ExpireOverdue).
  void Expire(absl::Time now, std::string error,
              absl::AnyInvocable<void(absl::StatusOr<std::vector<std::string>>) &&> done);

  // Saves the scheduler's fair-share accounts; `done` gets the status.
  void SaveAccounts(std::vector<store::AccountRow> rows, absl::Duration ttl,
                    absl::AnyInvocable<void(absl::Status) &&> done);
  // The same, waiting for it (the term's last save, as it stops).
  absl::Status SaveAccountsNow(const std::vector<store::AccountRow>& rows, absl::Duration ttl);

  // Runs `read` against the store on a writer thread; `read` returns what `done` gets.
  template <typename T>
  void Read(std::function<T(store::JobStore&)> read, absl::AnyInvocable<void(T) &&> done) {
    executor_.Schedule(
        [this, read = std::move(read), done = std::make_shared<decltype(done)>(std::move(done))] {
          std::move (*done)(read(store_));
        });
  }

  // True once a write was refused because another daemon leads.
  bool fenced() const { return fenced_.load(); }

 private:
  // The status of a write: remembers a broken fence, and refuses at once after one.
  absl::Status Check(absl::Status status);
  TurnResult Write(const store::TurnWrites& writes);
  // Counts each kind that failed in dispatchd_store_write_errors_total.
  static void CountErrors(const store::TurnWrites& writes, const TurnResult& r);

  store::JobStore& store_;
  std::atomic<bool> fenced_{false};
  server::Executor executor_;
};

// True if `status` is the store's refusal of a write whose fence another daemon has broken.
bool IsFenced(const absl::Status& status);

}  // namespace dispatchd::dispatch
