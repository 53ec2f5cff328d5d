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
  // Store writes: rows per statement and time to commit, by op (insert: the group inserter;
  // turn: a dispatcher turn's finishes, marks and claims).
  Family<Histogram>& store_rows;
  Family<Histogram>& store_commit;
  // Dispatcher writes the store failed (not answered, or refused by a trigger or constraint),
  // by kind: finish, mark, claim, retry, return, expire.
  Family<Counter>& store_write_errors;
  // Checks of the overflow hook (at each sweep while no run is going and its interval has
  // passed), by outcome: started, quiet (nothing waited for capacity) or failed (could not start).
  Family<Counter>& overflow_hook_checks;
  // Collected at scrape.
  Family<Gauge>& queued;         // {type, tier, model}
  Family<Gauge>& running;        // {type, tier, model}
  Family<Gauge>& rate_tokens;    // {model}
  Family<Gauge>& rate_waiting;   // {model}: 1 while its next job waits for a token
  Family<Gauge>& workers;        // connected workers
  Family<Gauge>& slots;          // {state}: busy or free
  Family<Counter>& model_loads;  // {worker}: models loaded since it connected
  Family<Gauge>& leader;         // 1 while this daemon leads
  // Calls refused by authentication or authorization, by reason
  Family<Counter>& auth_refusals;
};

// The process-wide instance.
DaemonMetrics& Metrics();

}  // namespace dispatchd::metrics
