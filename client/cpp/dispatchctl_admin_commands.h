#pragma once

// dispatchctl's commands for operators (AdminService and health): top, drain, reload, health,
// workers, stats, set-rate-limit and set-weight. Each prints its answer (JSON with `json`) and
// returns the exit code (dispatchctl_exit.h); a failed call is printed on stderr.
//
//   return CmdStats(client, /*json=*/true);
//
// Each runs on the calling thread.

#include <string>

#include "absl/time/time.h"

#include "client/cpp/dispatch_client.h"
#include "client/cpp/dispatchctl_flags.h"

namespace dispatchd::client::ctl {

// A refreshing view of queues, workers and rates: every `interval`, the types (queued, running,
// and successes and failures per second since the last refresh), the rate-limited models and the
// slots. On a terminal each refresh replaces the last; otherwise they follow one another.
// `iterations` > 0 stops after that many.
int CmdTop(Client& client, absl::Duration interval, int iterations);
// Drains a worker.
int CmdDrain(Client& client, const std::string& worker_id, bool json);
// Makes the daemon re-read its config file, and prints what changed only at a restart.
int CmdReload(Client& client, bool json);
// Asks the daemon's health service about `service` (empty: the whole daemon).
int CmdHealth(Client& client, const std::string& service, bool json);
// Lists the connected workers.
int CmdWorkers(Client& client, bool json);
// Prints the queues, the models, the tenants and keys, and the slots.
int CmdStats(Client& client, bool json);
// Changes or removes a model's rate limit until the daemon's next config load.
int CmdSetRateLimit(Client& client, const RateLimitFlags& flags, bool json);
// Changes a tenant's weight until the daemon's next config load.
int CmdSetWeight(Client& client, const std::string& tenant, double weight, bool json);

}  // namespace dispatchd::client::ctl
