#pragma once

// dispatchctl's job commands (JobService): submit, run, status, cancel and watch. Each prints its
// answer (JSON with `json`) and returns the exit code (dispatchctl_exit.h); a failed call is
// printed on stderr.
//
//   return CmdStatus(client, job_id, /*json=*/false);
//
// Each runs on the calling thread; watch draws its progress line from a thread of its own.

#include <string>

#include "absl/time/time.h"

#include "client/cpp/dispatch_client.h"
#include "client/cpp/dispatchctl_flags.h"

namespace dispatchd::client::ctl {

// Queues a job and prints its id (and says so on stderr when the idempotency key matched one).
int CmdSubmit(Client& client, const SpecFlags& flags, bool json);
// Queues a job, waits up to `wait` for it to end, and prints its result bytes.
int CmdRun(Client& client, const SpecFlags& flags, bool json, absl::Duration wait);
// Prints one job.
int CmdStatus(Client& client, const std::string& id, bool json);
// Cancels a job and prints its state.
int CmdCancel(Client& client, const std::string& id, bool json);
// Prints each state change of a job until it ends or `wait` passes.
int CmdWatch(Client& client, const std::string& id, bool json, absl::Duration wait);

}  // namespace dispatchd::client::ctl
