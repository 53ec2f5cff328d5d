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
      store_rows(registry.AddHistogram(
          "dispatchd_store_batch_rows",
          "Rows written per store statement, by op: insert (group commit of submits) or turn "
          "(a dispatcher turn's finishes, marks and claims).",
          {"op"}, SizeBuckets())),
      store_commit(registry.AddHistogram(
          "dispatchd_store_commit_seconds",
          "Time to run and commit one store statement, by op (insert or turn).", {"op"},
          SecondsBuckets())),
      store_write_errors(registry.AddCounter(
          "dispatchd_store_write_errors_total",
          "Dispatcher writes the store failed, by kind (finish, mark, claim, retry, return, "
          "expire); each goes again after a pause.",
          {"kind"})),
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
          {"reason"})) {}

DaemonMetrics& Metrics() {
  static DaemonMetrics* m = new DaemonMetrics();
  return *m;
}

}  // namespace dispatchd::metrics
