#include "server/metrics/daemon_metrics.h"

namespace dispatchd::metrics {

DaemonMetrics::DaemonMetrics()
    : admitted(registry.AddCounter("dispatchd_jobs_admitted_total",
                                   "Jobs admitted by Submit, SubmitBatch and RunSync.", {"type"})),
      refused(registry.AddCounter("dispatchd_jobs_refused_total",
                                  "Jobs refused at admission, by reason: max_active, "
                                  "max_queue_depth, submit_rate or invalid.",
                                  {"type", "reason"})),
      queue_wait(
          registry.AddHistogram("dispatchd_job_queue_wait_seconds",
                                "Time from a job's queueing (or its not_before) to its dispatch.",
                                {"type"}, SecondsBuckets())),
      run_time(registry.AddHistogram(
          "dispatchd_job_run_seconds",
          "Time from a worker's accept of an attempt to its result (success or failure).", {"type"},
          SecondsBuckets())),
      decision(registry.AddHistogram(
          "dispatchd_dispatch_decision_seconds",
          "Time the scheduler takes to decide one dispatcher turn's dispatches, on the loop "
          "thread, whether or not it places any.",
          {}, FineSecondsBuckets())),
      store_rows(registry.AddHistogram(
          "dispatchd_store_batch_rows",
          "Rows written per store statement, by op: insert (group commit of submits) or turn "
          "(a dispatcher turn's finishes, marks and claims).",
          {"op"}, SizeBuckets())),
      store_commit(registry.AddHistogram(
          "dispatchd_store_commit_seconds",
          "Time to run and commit one store statement, by op (insert or turn).", {"op"},
          SecondsBuckets())),
      insert_wait(registry.AddHistogram(
          "dispatchd_store_insert_wait_seconds",
          "Time a call's jobs (Submit, SubmitBatch, RunSync) wait between their hand-off to the "
          "group inserter and the start of their insert statement: the queue behind the "
          "statement under way, and the leader's placement.",
          {}, FineSecondsBuckets())),
      store_write_errors(registry.AddCounter(
          "dispatchd_store_write_errors_total",
          "Dispatcher writes the store failed, by kind (finish, mark, claim, retry, return, "
          "expire); each goes again after a pause.",
          {"kind"})),
      turns_in_flight(registry.AddGauge(
          "dispatchd_turns_in_flight",
          "Dispatcher turns (one transaction each of finishes, RUNNING marks and claims) in the "
          "database now. At most postgres.turns_in_flight; held there, the next turn waits.")),
      overflow_hook_checks(registry.AddCounter(
          "dispatchd_overflow_hook_checks_total",
          "Checks of the overflow hook, by outcome: started (jobs waited for capacity and the "
          "command ran), quiet (none waited) or failed (the command could not be started).",
          {"outcome"})),
      queued(registry.AddGauge("dispatchd_jobs_queued",
                               "Jobs waiting to be dispatched (held in memory or paged out).",
                               {"type", "tier", "model"})),
      running(registry.AddGauge("dispatchd_jobs_running", "Jobs dispatched to a worker or running.",
                                {"type", "tier", "model"})),
      rate_tokens(registry.AddGauge("dispatchd_rate_limit_tokens",
                                    "Tokens in the rate-limit bucket of a model (or of a type "
                                    "without one).",
                                    {"model"})),
      rate_waiting(registry.AddGauge(
          "dispatchd_rate_limit_waiting",
          "1 while the next job of a model waits for a token of its rate limit, else 0.",
          {"model"})),
      workers(registry.AddGauge("dispatchd_workers", "Connected workers.")),
      type_workers(registry.AddGauge(
          "dispatchd_type_workers",
          "Connected workers that serve a job type and are not draining, by type; 0 for a "
          "configured type no such worker serves.",
          {"type"})),
      slots(registry.AddGauge("dispatchd_worker_slots",
                              "Task slots of the connected workers, by state: busy or free.",
                              {"state"})),
      model_loads(registry.AddCounter("dispatchd_worker_model_loads_total",
                                      "Models a connected worker has loaded since it connected.",
                                      {"worker"})),
      leader(registry.AddGauge("dispatchd_leader",
                               "1 while this daemon leads (schedules), 0 on a standby.")),
      auth_refusals(registry.AddCounter(
          "dispatchd_auth_refusals_total",
          "Calls refused before their handler ran, by reason: no_credentials, bad_token, "
          "unknown_certificate, malformed (UNAUTHENTICATED) or role (PERMISSION_DENIED).",
          {"reason"})),
      config_reloads(registry.AddCounter(
          "dispatchd_config_reloads_total",
          "Config reloads (SIGHUP or AdminService.Reload), by outcome: applied or refused (the "
          "running config stays in force).",
          {"outcome"})),
      leader_terms(registry.AddCounter("dispatchd_leader_terms_total",
                                       "Terms this daemon began as leader, its jobs loaded.")),
      leader_step_downs(registry.AddCounter(
          "dispatchd_leader_step_downs_total",
          "Times this daemon stepped down from a term counted in dispatchd_leader_terms_total: "
          "its lease could not be renewed in time, its database session was lost, or it is "
          "stopping.")),
      lease_lapses(registry.AddCounter(
          "dispatchd_leader_lease_lapses_total",
          "Times this daemon, as a standby, found the leader had not renewed its lease for a "
          "whole lease and ended the leader's database sessions.")),
      worker_redirects(registry.AddCounter(
          "dispatchd_worker_redirects_total",
          "Worker streams this daemon, as a standby, answered with the leader's address.")),
      worker_stream_messages(registry.AddCounter(
          "dispatchd_worker_stream_messages_total",
          "Messages on worker streams, by direction: received (a Batch of answers and results "
          "counts once) or sent (written to the stream; an Assign of many jobs counts once).",
          {"direction"})),
      accounting_repairs(registry.AddCounter(
          "dispatchd_accounting_repairs_total",
          "Drifts the leader found and repaired, by kind: lost_on_worker, not_own, "
          "untracked_claim, stray, ended_elsewhere, unknown_queued, count_drift.",
          {"kind"})),
      results_discarded(registry.AddCounter(
          "dispatchd_results_discarded_total",
          "Results of an attempt that is no longer current (the job ended or was retried), or of "
          "a job no longer held here (a result resent after its acknowledgement was lost): "
          "acknowledged and dropped.")),
      worker_refusals(registry.AddCounter(
          "dispatchd_worker_refusals_total",
          "Assignments a worker refused, by reason: resource_exhausted, unsupported, draining or "
          "unspecified. The job goes back to the queue with no attempt used.",
          {"reason"})),
      partitions_dropped(registry.AddCounter(
          "dispatchd_retention_partitions_dropped_total",
          "Partitions of ended jobs dropped once wholly older than the retention.")),
      queued_paged(registry.AddGauge(
          "dispatchd_jobs_queued_paged",
          "Queued jobs left in the database beyond their queue's window (scheduler.queue_window), "
          "by type; part of dispatchd_jobs_queued.",
          {"type"})) {
  // Every value of a bounded label is shown from the start, at 0, so that a rate over the first
  // occurrence is not lost and a dashboard has a series to draw.
  for (const char* outcome : {"applied", "refused"}) config_reloads.With({outcome});
  for (const char* kind :
       {repair::kLostOnWorker, repair::kNotOwn, repair::kUntrackedClaim, repair::kStray,
        repair::kEndedElsewhere, repair::kUnknownQueued, repair::kCountDrift}) {
    accounting_repairs.With({kind});
  }
  for (const char* reason : {"resource_exhausted", "unsupported", "draining", "unspecified"}) {
    worker_refusals.With({reason});
  }
  for (const char* direction : {"received", "sent"}) worker_stream_messages.With({direction});
}

DaemonMetrics& Metrics() {
  static DaemonMetrics* m = new DaemonMetrics();
  return *m;
}

}  // namespace dispatchd::metrics
