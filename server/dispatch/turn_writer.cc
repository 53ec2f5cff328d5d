#include "server/dispatch/turn_writer.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"

#include "server/metrics/daemon_metrics.h"

namespace dispatchd::dispatch {
namespace {

// Moves a move-only callback into the copyable task server::Executor takes.
template <typename F>
std::shared_ptr<F> Share(F f) {
  return std::make_shared<F>(std::move(f));
}

}  // namespace

bool IsFenced(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) && absl::StartsWith(status.message(), "fenced");
}

absl::Status TurnResult::first_error() const {
  for (const absl::Status* s : {&finishes, &marks, &claims, &retries, &returns}) {
    if (!s->ok()) return *s;
  }
  return absl::OkStatus();
}

TurnWriter::TurnWriter(store::JobStore& store, int threads)
    : store_(store), executor_("turn-writer", threads) {}

TurnWriter::~TurnWriter() = default;

absl::Status TurnWriter::Check(absl::Status status) {
  if (IsFenced(status)) fenced_.store(true);
  return status;
}

void TurnWriter::Commit(store::TurnWrites writes, absl::AnyInvocable<void(TurnResult) &&> done) {
  executor_.Schedule([this, writes = std::move(writes), done = Share(std::move(done))] {
    TurnResult r = Write(writes);
    CountErrors(writes, r);
    std::move (*done)(std::move(r));
  });
}

TurnResult TurnWriter::Write(const store::TurnWrites& writes) {
  TurnResult r;
  if (fenced_.load()) {
    absl::Status refused = absl::FailedPreconditionError(
        "fenced: another daemon leads; this term writes nothing more");
    r.finishes = r.marks = r.claims = r.retries = r.returns = refused;
    return r;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<store::TurnOutcome> out = store_.WriteTurn(writes);
  if (out.ok()) {
    metrics::DaemonMetrics& m = metrics::Metrics();
    m.store_rows.With({"turn"}).Observe(static_cast<double>(writes.rows()));
    m.store_commit.With({"turn"}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
    r.out = *std::move(out);
    return r;
  }
  const absl::Status failed = Check(out.status());
  r.finishes = r.marks = r.claims = r.retries = r.returns = failed;
  const int kinds = !writes.finishes.empty() + !writes.marks.empty() + !writes.claims.empty() +
                    !writes.retries.empty() + !writes.returns.empty();
  if (kinds < 2 || absl::IsUnavailable(failed) || IsFenced(failed)) return r;
  // One kind the database refuses must not hold up the others: each on its own.
  auto alone = [&](absl::Status* status, auto fill) {
    store::TurnWrites one;
    fill(one);
    if (one.empty()) return;
    absl::StatusOr<store::TurnOutcome> o = store_.WriteTurn(one);
    *status = Check(o.status());
    if (!o.ok()) return;
    for (auto [to, from] :
         {std::pair{&r.out.finished, &o->finished}, std::pair{&r.out.marked, &o->marked},
          std::pair{&r.out.claimed, &o->claimed}, std::pair{&r.out.retried, &o->retried},
          std::pair{&r.out.returned, &o->returned}}) {
      for (std::string& id : *from) to->push_back(std::move(id));
    }
    for (std::string& p : o->claimed_payloads) r.out.claimed_payloads.push_back(std::move(p));
    for (std::optional<store::TurnOutcome::Times>& t : o->finished_times) {
      r.out.finished_times.push_back(t);
    }
  };
  alone(&r.finishes, [&](store::TurnWrites& w) { w.finishes = writes.finishes; });
  alone(&r.marks, [&](store::TurnWrites& w) { w.marks = writes.marks; });
  alone(&r.claims, [&](store::TurnWrites& w) { w.claims = writes.claims; });
  alone(&r.retries, [&](store::TurnWrites& w) { w.retries = writes.retries; });
  alone(&r.returns, [&](store::TurnWrites& w) { w.returns = writes.returns; });
  return r;
}

void TurnWriter::CountErrors(const store::TurnWrites& writes, const TurnResult& r) {
  metrics::DaemonMetrics& m = metrics::Metrics();
  const std::pair<const char*, bool> kinds[] = {
      {"finish", !writes.finishes.empty() && !r.finishes.ok()},
      {"mark", !writes.marks.empty() && !r.marks.ok()},
      {"claim", !writes.claims.empty() && !r.claims.ok()},
      {"retry", !writes.retries.empty() && !r.retries.ok()},
      {"return", !writes.returns.empty() && !r.returns.ok()}};
  for (const auto& [kind, failed] : kinds) {
    if (failed) m.store_write_errors.With({kind}).Inc();
  }
}

void TurnWriter::Expire(
    absl::Time now, std::string error,
    absl::AnyInvocable<void(absl::StatusOr<std::vector<std::string>>) &&> done) {
  executor_.Schedule([this, now, error = std::move(error), done = Share(std::move(done))] {
    if (fenced_.load()) {
      std::move (*done)(absl::FailedPreconditionError("fenced: another daemon leads"));
      return;
    }
    absl::StatusOr<std::vector<std::string>> expired = store_.ExpireOverdue(now, error);
    if (!expired.ok()) {
      expired = Check(expired.status());
      metrics::Metrics().store_write_errors.With({"expire"}).Inc();
    }
    std::move (*done)(std::move(expired));
  });
}

void TurnWriter::SaveAccounts(std::vector<store::AccountRow> rows, absl::Duration ttl,
                              absl::AnyInvocable<void(absl::Status) &&> done) {
  executor_.Schedule([this, rows = std::move(rows), ttl, done = Share(std::move(done))] {
    std::move (*done)(SaveAccountsNow(rows, ttl));
  });
}

absl::Status TurnWriter::SaveAccountsNow(const std::vector<store::AccountRow>& rows,
                                         absl::Duration ttl) {
  if (fenced_.load()) return absl::FailedPreconditionError("fenced: another daemon leads");
  return Check(store_.SaveAccounts(rows, ttl));
}

}  // namespace dispatchd::dispatch
