#include "server/dispatch/job_intake.h"

#include <utility>

#include "server/dispatch/dispatcher.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

void StandbyIntake::Queued(job::Job job, sched::Reservation reservation, bool notified) {
  reservation = sched::Reservation();  // counted now: the leader's load comes from the database
  if (!notified) Notify(job.id);       // leadership changed while the row was written
}

void StandbyIntake::Cancelled(const std::string& job_id, job::JobState /*previous*/) {
  Notify(job_id);
  events_.Publish(job_id, job::JobState::kCancelled);
}

void StandbyIntake::Notify(const std::string& job_id) {
  if (absl::Status told = store_.NotifyChanged(job_id); !told.ok()) {
    server::Log("grpc")->warn("could not notify the leader of job={}: {}", job_id, told.message());
  }
}

std::shared_ptr<store::Placer> LeaderIntake::placer() const { return dispatcher_; }

void LeaderIntake::Queued(job::Job job, sched::Reservation reservation, bool notified) {
  if (dispatcher_->JobQueued(job, reservation)) return;
  fallback_.Queued(std::move(job), std::move(reservation), notified);
}

void LeaderIntake::Cancelled(const std::string& job_id, job::JobState previous) {
  dispatcher_->JobCancelled(job_id, previous);
}

std::optional<sched::WaitInfo> LeaderIntake::WhyWaiting(const job::Job& row, bool* paged_out) {
  return dispatcher_->WhyWaiting(row, paged_out);
}

}  // namespace dispatchd::dispatch
