#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dispatchd::config {

// What happens to a RUNNING job whose worker vanished or whose daemon restarted.
enum class OnOrphan { kRequeue, kFail };

inline constexpr int kUnlimited = std::numeric_limits<int>::max();

// One registered job type (`types[i]` in the YAML file).
struct JobTypeConfig {
  std::string name;
  // Jobs of this type running at once, across all workers.
  int max_concurrency = kUnlimited;
  // Attempts before a job fails for good (a request may ask for fewer or more).
  int max_attempts = 3;
  // Execution timeout of one attempt.
  absl::Duration timeout = absl::Minutes(10);
  // Delay before the first retry; doubles with each attempt up to `max_backoff`.
  absl::Duration retry_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Minutes(1);
  OnOrphan on_orphan = OnOrphan::kRequeue;
  // Affinity key: jobs of one model share a loaded model on a worker. Empty: none.
  std::string model;
};

struct PostgresConfig {
  // libpq connection URL. Empty: run an embedded server under `state_dir`.
  std::string url;
  // Connections the daemon keeps open.
  int pool_size = 4;
  // OS user the embedded server runs as when the daemon runs as root.
  std::string embedded_user = "postgres";
  // Directory holding the PostgreSQL server binaries (initdb, pg_ctl, postgres).
  std::string bin_dir = "/usr/lib/postgresql/15/bin";
  // At start, how long to keep retrying an unreachable database before exiting.
  absl::Duration connect_wait = absl::Seconds(10);
};

// The daemon's whole configuration. Defaults sit in the member initializers; Validate() says
// which key is wrong.
struct Config {
  // gRPC listen address, host:port. Loopback unless an operator opens it up.
  std::string listen = "127.0.0.1:7411";
  // Where the daemon keeps its own files (the embedded database among them).
  std::string state_dir = "/var/lib/dispatchd";
  // trace, debug, info, warn, error.
  std::string log_level = "info";
  // Largest payload a job may carry.
  int64_t max_payload_bytes = 1 << 20;
  // How often workers must send a heartbeat.
  absl::Duration heartbeat_interval = absl::Seconds(5);
  // A worker silent for longer than this is lost; strictly more than 2 * heartbeat_interval.
  absl::Duration worker_stale_after = absl::Seconds(15);
  // After a restart, how long jobs that were dispatched or running wait for their workers to
  // reconnect and re-adopt them before on_orphan applies.
  absl::Duration orphan_grace = absl::Seconds(30);
  PostgresConfig postgres;
  std::vector<JobTypeConfig> types;

  // OK, or InvalidArgument naming the offending key, e.g. "types[2].max_concurrency: must be >= 1".
  absl::Status Validate() const;

  // The type named `name`, or nullptr.
  const JobTypeConfig* FindType(absl::string_view name) const;
};

}  // namespace dispatchd::config
