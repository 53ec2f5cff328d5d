#pragma once

// The load generator's two ways of driving a daemon's JobService, on gRPC's completion-queue API
// (a few threads for any number of calls in flight, so the client costs little next to the
// daemon, PostgreSQL and the workers on a shared machine):
//
//   Flood:  `clients` channels, each keeping `inflight` Submit calls (or SubmitBatch calls of
//           `batch` specs) in flight until `jobs` jobs are queued.
//   Probes: one channel sending `count` Submit or RunSync calls at a steady `rate`, at most
//           `inflight` at once, each timed from its send to its answer.
//
//   absl::StatusOr<RunSummary> run = RunFlood({.server = "127.0.0.1:7411", .jobs = 100000});
//
// RESOURCE_EXHAUSTED is expected under admission control: the call is sent again after the
// daemon's `retry-after-ms` trailer (10 ms without one) and counted. Any other failure is an
// error: no new call starts, the ones in flight finish, and the summary counts it.
// Times are the system clock (CLOCK_REALTIME) in microseconds since the Unix epoch, so they
// compare with times taken by other processes on the same host (e.g. a worker's start log).
// Not thread-safe: each Run* call owns its threads and returns when they have all finished.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "client/cpp/credentials.h"

namespace dispatchd::bench {

// What every call carries.
struct JobTemplate {
  // Job type (must be configured on the daemon).
  std::string type = "noop";
  // Payload of every job (at least one byte).
  std::string payload = "x";
};

struct FloodOptions {
  // Daemon address host:port (or a list, as dispatchctl takes).
  std::string server;
  // TLS and bearer token of every channel and call (client::LoadCredentials); no channel
  // credentials: plaintext, no token.
  client::Credentials credentials;
  JobTemplate job;
  // Jobs to queue in all.
  int64_t jobs = 0;
  // Channels (each its own TCP connection), i.e. independent clients.
  int clients = 8;
  // Calls each client keeps in flight.
  int inflight = 64;
  // Specs per call: 1 sends Submit, more send SubmitBatch (the last call may carry fewer).
  int batch = 1;
  // Completion-queue threads; the clients are spread over them.
  int threads = 1;
  // Deadline of each call.
  absl::Duration call_timeout = absl::Seconds(60);
  // Keep a JobRecord per job queued (RunSummary::records).
  bool keep_records = false;
};

enum class ProbeKind { kSubmit, kRunSync };

struct ProbeOptions {
  std::string server;
  client::Credentials credentials;
  JobTemplate job;
  ProbeKind kind = ProbeKind::kSubmit;
  // Probes sent in all, the first `warmup` of them not counted in the latencies.
  int64_t count = 0;
  int64_t warmup = 0;
  // Probes sent per second (on a fixed schedule; a probe due while `inflight` are still out
  // leaves as soon as one returns, and is counted as late).
  double rate = 100;
  int inflight = 1;
  // Deadline of each call (for RunSync: how long it may wait for the job to end).
  absl::Duration call_timeout = absl::Seconds(60);
  // Keep a JobRecord per probe (RunSummary::records).
  bool keep_records = false;
};

// One job as the client saw it.
struct JobRecord {
  // Send order of the call that carried it (0-based; probes below `warmup` are warm-up).
  int64_t seq = 0;
  std::string job_id;
  // When its call was sent and when it was answered.
  int64_t sent_us = 0;
  int64_t answered_us = 0;
};

// Latency percentiles (nearest rank) of a set of samples, in microseconds.
struct LatencySummary {
  int64_t count = 0;
  int64_t p50_us = 0;
  int64_t p90_us = 0;
  int64_t p99_us = 0;
  int64_t p999_us = 0;
  int64_t max_us = 0;
  double mean_us = 0;
};
// REQUIRES: nothing; an empty set gives all zeros. Sorts `samples`.
LatencySummary Summarize(std::vector<int64_t>& samples);

struct RunSummary {
  // Jobs the daemon acknowledged (queued, or with RunSync: ran to SUCCEEDED).
  int64_t jobs = 0;
  // Calls answered OK.
  int64_t calls = 0;
  // RESOURCE_EXHAUSTED answers, each followed by a resend after the retry-after hint.
  int64_t resource_exhausted = 0;
  // Any other failure, and the first few messages.
  int64_t errors = 0;
  std::vector<std::string> error_messages;
  // Probes that left after their scheduled time because `inflight` calls were out.
  int64_t late = 0;
  // From the first send to the last answer (system clock, µs).
  int64_t start_us = 0;
  int64_t end_us = 0;
  // Send-to-answer time of each OK call (probes: after the warm-up).
  LatencySummary call_latency;
  std::vector<JobRecord> records;
};

// Waits until a channel is connected and the daemon reports `workers` connected workers
// (0: do not wait for workers). DEADLINE_EXCEEDED after `timeout`. Listing the workers is an
// AdminService call: with authentication on, `credentials` must name an admin (a client's
// token is refused PERMISSION_DENIED).
absl::Status WaitForDaemon(const std::string& server, const client::Credentials& credentials,
                           int workers, absl::Duration timeout);

// INVALID_ARGUMENT for a bad option, naming it. Otherwise the summary, whatever the calls
// answered (check `errors`).
absl::StatusOr<RunSummary> RunFlood(const FloodOptions& options);
absl::StatusOr<RunSummary> RunProbes(const ProbeOptions& options);

}  // namespace dispatchd::bench
