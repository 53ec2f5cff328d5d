#pragma once

#include <memory>
#include <optional>
#include <string>

#include "lib/job/job.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/scheduler.h"
#include "server/dispatch/job_events.h"
#include "server/store/group_inserter.h"
#include "server/store/job_store.h"

namespace dispatchd::dispatch {

class Dispatcher;

// Where the rows a daemon commits for its clients go next, whether it leads or not: the job
// service hands each inserted or cancelled job to the intake of the moment
// (ha::Leadership::intake()) and never asks who leads.
//
//   std::shared_ptr<JobIntake> intake = leadership.intake();
//   inserter.Insert(jobs, intake->NotifiesOnInsert(), ...);   // then, once committed:
//   intake->Queued(std::move(job), std::move(reservation), notified);
//
// Thread-safe.
class JobIntake {
 public:
  virtual ~JobIntake() = default;

  // Whether an insert should announce its rows to the leader in its own statement (a standby's
  // rows reach the leader only through the database).
  virtual bool NotifiesOnInsert() const = 0;
  // Who places the jobs an insert writes on workers in that insert (see store::Placer): the
  // leader's dispatcher; null on a standby.
  virtual std::shared_ptr<store::Placer> placer() const = 0;
  // A job's row is committed, QUEUED (or DISPATCHED, placed by placer()). `reservation` is its
  // admission reservation, written: it is counted once the job is held, or at once. `notified`: its
  // insert announced it already.
  virtual void Queued(job::Job job, sched::Reservation reservation, bool notified) = 0;
  // A job's row moved to CANCELLED from `previous`.
  virtual void Cancelled(const std::string& job_id, job::JobState previous) = 0;
  // Why a QUEUED job waits and its place in line, if this daemon's scheduler knows it (see
  // Dispatcher::WhyWaiting); nullopt on a standby.
  virtual std::optional<sched::WaitInfo> WhyWaiting(const job::Job& row, bool* paged_out) = 0;
};

// A standby's intake: the leader, wherever it runs, learns of each row from the database, by a
// NOTIFY (store::JobStore::NotifyChanged) and at its next recount.
class StandbyIntake final : public JobIntake {
 public:
  StandbyIntake(store::JobStore& store, JobEvents& events) : store_(store), events_(events) {}

  bool NotifiesOnInsert() const override { return true; }
  std::shared_ptr<store::Placer> placer() const override { return nullptr; }
  void Queued(job::Job job, sched::Reservation reservation, bool notified) override;
  void Cancelled(const std::string& job_id, job::JobState previous) override;
  std::optional<sched::WaitInfo> WhyWaiting(const job::Job&, bool*) override {
    return std::nullopt;
  }

 private:
  void Notify(const std::string& job_id);

  store::JobStore& store_;
  JobEvents& events_;
};

// The leader's intake: its dispatcher takes each row. Once the dispatcher has begun to stop (the
// term is ending) the rows go the standby's way, to whichever daemon leads next.
class LeaderIntake final : public JobIntake {
 public:
  LeaderIntake(std::shared_ptr<Dispatcher> dispatcher, StandbyIntake& fallback)
      : dispatcher_(std::move(dispatcher)), fallback_(fallback) {}

  bool NotifiesOnInsert() const override { return false; }
  std::shared_ptr<store::Placer> placer() const override;
  void Queued(job::Job job, sched::Reservation reservation, bool notified) override;
  void Cancelled(const std::string& job_id, job::JobState previous) override;
  std::optional<sched::WaitInfo> WhyWaiting(const job::Job& row, bool* paged_out) override;

 private:
  const std::shared_ptr<Dispatcher> dispatcher_;
  StandbyIntake& fallback_;
};

}  // namespace dispatchd::dispatch
