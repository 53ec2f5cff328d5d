#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/admission_gate.h"
#include "lib/util/clock.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/job_events.h"
#include "server/dispatch/job_intake.h"
#include "server/store/job_store.h"
#include "server/store/pg_leader_lease.h"

namespace dispatchd::ha {

// Who leads, as this daemon last saw it.
struct LeaderInfo {
  bool is_leader = false;  // this daemon
  std::string address;     // the leader's address; empty while none is known
  int64_t epoch = 0;       // its term
};

struct LeadershipOptions {
  // The database (the same one the store uses).
  std::string url;
  // Unique among the daemons sharing the database; names this daemon's sessions.
  std::string daemon_id;
  absl::Duration connect_timeout = absl::Seconds(5);
};

// The PostgreSQL application_name of every session of daemon `daemon_id` (store and lease), so
// that a new leader can end all of a frozen leader's sessions.
std::string ApplicationName(const std::string& daemon_id);

// Runs leader election among the daemons that share one database, and this daemon's role in it.
//
// The leader holds an advisory lock (store::PgLeaderLease), renews its lease every `ha.lease / 4`
// and runs the one Dispatcher that schedules; its store writes carry its epoch as a fence. A
// standby tries the lock every `ha.lease / 4` and at once when a stopping leader hands it over
// (Stop), ends the sessions of a leader that has not renewed for `ha.lease`, feeds the admission
// gate from the database's counts once a second, and polls
// the rows of jobs its own RunSync and Watch calls wait for (JobEvents). Losing the lease (its
// session broke, the database restarted, another epoch began) stops the dispatcher at once; the
// daemon then competes again as a standby, and a new term starts from the database.
//
//   ha::Leadership leadership(config, {.url = url, .daemon_id = id}, store, clock, events, gate);
//   DISPATCHD_RETURN_IF_ERROR(leadership.Start("10.0.0.5:7411"));
//   leadership.intake()->Queued(std::move(job), std::move(reservation), notified);
//
// Thread-safe. The election runs on a thread of its own.
class Leadership {
 public:
  Leadership(const config::Config& config, LeadershipOptions options, store::JobStore& store,
             Clock& clock, dispatch::JobEvents& events, sched::AdmissionGate& admission);
  ~Leadership();
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  // Runs the first round (this daemon leads, with its jobs loaded, or knows it is a standby),
  // then keeps running rounds on a thread. `address` is where workers and clients reach this
  // daemon when it leads. Unavailable if the database cannot be reached.
  absl::Status Start(std::string address) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the election; a leader stops its dispatcher and hands the lease over: the lock is freed
  // and the standbys are told, so one of them leads within a round (100 ms), not a lease.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The dispatcher of this daemon's current term; null while it does not lead.
  std::shared_ptr<dispatch::Dispatcher> dispatcher() const ABSL_LOCKS_EXCLUDED(mu_);
  // Where committed jobs go now: the current term's dispatcher, or the leader through the
  // database (dispatch::JobIntake). Never null.
  std::shared_ptr<dispatch::JobIntake> intake() const ABSL_LOCKS_EXCLUDED(mu_);
  LeaderInfo leader() const ABSL_LOCKS_EXCLUDED(mu_);
  // A reloaded config (config::MergeReload): the current dispatcher takes it at once, and every
  // later term starts with it. Its `ha` keys are not reloaded.
  void UpdateConfig(const config::Config& config) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the election thread and, while this daemon leads, the dispatcher loop have both
  // come round within `stall` (wall time); if not, `*why` names the one that has not. For the
  // service manager's watchdog: a daemon stuck there is better restarted.
  bool MakingProgress(absl::Duration stall, std::string* why) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether this daemon can serve: its last election round reached the database, and, while it
  // leads, its dispatcher loop has come round within `stall`. If not, `*why` says what is wrong.
  // For the gRPC health service. Thread-safe.
  bool Serving(absl::Duration stall, std::string* why) const ABSL_LOCKS_EXCLUDED(mu_);
  sched::AdmissionGate& admission() { return admission_; }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Both return false when the lease session must be dropped (and reopened).
  bool LeadTick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Renews the lease when due; steps down (and returns false) when it cannot, or when the last
  // renewal is ¾ of a lease old.
  bool RenewIfDue(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::unique_ptr<store::PgLeaderLease>> OpenLease() const;
  bool StandbyTick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the lease if it is free; clears away a frozen leader. False on a session error.
  bool TryLead(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void Promote(int64_t epoch, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void Demote(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  void PollWatched();
  void RefreshAdmission();
  bool Stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  const config::Config& config_;
  const LeadershipOptions options_;
  std::string address_;  // set by Start, before the election thread exists
  store::JobStore& store_;
  Clock& clock_;
  dispatch::JobEvents& events_;
  sched::AdmissionGate& admission_;
  const absl::Duration tick_;      // how often a round runs
  const absl::Duration interval_;  // lease renewal and lock attempts: ha.lease / 4

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<dispatch::Dispatcher> dispatcher_ ABSL_GUARDED_BY(mu_);
  // The standby's intake (always there; the leader's falls back on it as its term ends), and the
  // intake of the moment: the leader's while a dispatcher runs, else the standby's.
  const std::shared_ptr<dispatch::StandbyIntake> standby_intake_;
  std::shared_ptr<dispatch::JobIntake> intake_ ABSL_GUARDED_BY(mu_);
  // The config each new term's dispatcher starts with: the last reload's, else `config_`.
  std::shared_ptr<const config::Config> reloaded_ ABSL_GUARDED_BY(mu_);
  LeaderInfo info_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  // When the election thread last began a round (wall time), for MakingProgress.
  std::atomic<int64_t> last_round_ns_{absl::ToUnixNanos(absl::Now())};
  // Whether the last election round reached the database (its session open, its statements ok).
  std::atomic<bool> database_ok_{false};

  // Confined to the election thread (and to Start, before the thread exists).
  std::unique_ptr<store::PgLeaderLease> lease_;
  int64_t epoch_ = 0;  // > 0 while leading
  absl::Time next_connect_ = absl::InfinitePast();
  absl::Time next_try_ = absl::InfinitePast();
  absl::Time next_renew_ = absl::InfinitePast();
  absl::Time renewed_ = absl::InfinitePast();  // the last successful renewal (or the epoch bump)
  absl::Time next_refresh_ = absl::InfinitePast();
  absl::flat_hash_map<std::string, job::JobState> watched_;  // last state published per job
};

}  // namespace dispatchd::ha
