#pragma once

#include "server/metrics/registry.h"

namespace dispatchd::metrics {

// The daemon's metrics (docs/operations.md, *Metrics*), in one process-wide registry that the
// HTTP endpoint renders. Counters and histograms are recorded where things happen; gauges of
// state (queues, workers, leadership) are filled by collectors that main() adds at start.
struct DaemonMetrics {
  DaemonMetrics();

  Registry registry;
  // Admission (JobService): jobs admitted by type; refused by type and reason
  // (max_active, max_queue_depth, invalid).
  Family<Counter>& admitted;
  Family<Counter>& refused;
  // Dispatcher: from queued (or not_before) to dispatch, and from a worker's accept to the end of
  // the attempt (success or failure), by type.
  Family<Histogram>& queue_wait;
  Family<Histogram>& run_time;
  // Dispatcher: the time the scheduler takes to decide one turn's dispatches (Scheduler::Decide
  // on the loop thread), whether or not it places any.
  Family<Histogram>& decision;
  // Store writes: rows per statement and time to commit, by op (insert: the group inserter;
  // turn: a dispatcher turn's finishes, marks and claims).
  Family<Histogram>& store_rows;
  Family<Histogram>& store_commit;
  Family<Histogram>& insert_wait;
  // Dispatcher writes the store failed (not answered, or refused by a trigger or constraint),
  // by kind: finish, mark, claim, retry, return, expire.
  Family<Counter>& store_write_errors;
  // Dispatcher turns in the database now: at most postgres.turns_in_flight; 0 on a standby.
  Family<Gauge>& turns_in_flight;
  // Checks of the overflow hook (at each sweep while no run is going and its interval has
  // passed), by outcome: started, quiet (nothing waited for capacity) or failed (could not start).
  Family<Counter>& overflow_hook_checks;
  // Collected at scrape.
  Family<Gauge>& queued;         // {type, tier, model}
  Family<Gauge>& running;        // {type, tier, model}
  Family<Gauge>& rate_tokens;    // {model}
  Family<Gauge>& rate_waiting;   // {model}: 1 while its next job waits for a token
  Family<Gauge>& workers;        // connected workers
  Family<Gauge>& type_workers;   // {type}: connected workers serving it, not draining
  Family<Gauge>& slots;          // {state}: busy or free
  Family<Counter>& model_loads;  // {worker}: models loaded since it connected
  Family<Gauge>& leader;         // 1 while this daemon leads
  // Calls refused by authentication or authorization, by reason
  Family<Counter>& auth_refusals;
  // Config reloads (SIGHUP or AdminService.Reload), by outcome: applied or refused.
  Family<Counter>& config_reloads;
  // Leadership: terms this daemon began (its jobs loaded), terms it stepped down from, leaders
  // it found past their lease as a standby (and ended their sessions), worker streams it sent
  // to the leader as a standby.
  Family<Counter>& leader_terms;
  Family<Counter>& leader_step_downs;
  Family<Counter>& lease_lapses;
  Family<Counter>& worker_redirects;
  // Messages on worker streams, by direction: received (a Batch counts once) or sent.
  Family<Counter>& worker_stream_messages;
  // Drifts the leader's dispatcher found and repaired, by kind (`repair` below).
  Family<Counter>& accounting_repairs;
  // Results of an attempt that is not current (the job ended, or was retried): acknowledged so
  // the worker stops resending, and dropped.
  Family<Counter>& results_discarded;
  // Assignments a worker refused (Reject), by reason: resource_exhausted, unsupported, draining,
  // unspecified.
  Family<Counter>& worker_refusals;
  // Partitions of ended jobs dropped once past `retention`.
  Family<Counter>& partitions_dropped;
  // Collected at scrape: queued jobs left in the database beyond their queue's window, by type
  // (a part of `queued`; the rest are held in memory).
  Family<Gauge>& queued_paged;
};

// The kinds of `accounting_repairs`, one per way the dispatcher's view and the truth (a worker's
// heartbeats, the database, its own recount) can part.
namespace repair {
inline constexpr char kLostOnWorker[] = "lost_on_worker";     // a worker stopped reporting a job
inline constexpr char kNotOwn[] = "not_own";                  // a worker ran a job not its own
inline constexpr char kUntrackedClaim[] = "untracked_claim";  // claimed a job no longer held
inline constexpr char kStray[] = "stray";                     // a placed row not known here
inline constexpr char kEndedElsewhere[] = "ended_elsewhere";  // a held job ended in the database
inline constexpr char kUnknownQueued[] = "unknown_queued";    // a queued row not known here
inline constexpr char kCountDrift[] = "count_drift";          // a scheduler count was off
}  // namespace repair

// The process-wide instance.
DaemonMetrics& Metrics();

}  // namespace dispatchd::metrics
