#pragma once

// End-to-end harness: real dispatchd, dispatch-worker and dispatchctl processes on 127.0.0.1,
// each test with its own database (tests/testing/pg_test_db.h) and temporary directory. Every
// wait has a deadline; nothing here asserts on wall-clock timings.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include <sys/types.h>

#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"

namespace dispatchd::e2e {

// A child process with stdout and stderr sent to a log file. Killed (SIGKILL) on destruction if
// still running.
class Process {
 public:
  // Starts `argv` (argv[0] is a path). `log_path` receives stdout and stderr.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                        const std::string& log_path);
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  bool Running();
  void Signal(int sig);
  // Waits for exit up to `timeout`; the exit code (128+signal if killed), or DeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Everything the process wrote so far.
  std::string Log() const;

 private:
  Process(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// Output of a finished command.
struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a command to completion (bounded by `timeout`), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(60),
                         const std::string& stdin_data = "");

// Polls `done` every 50 ms until it returns true or `timeout` passes; returns its last answer.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout);

// Paths of the binaries under test (compiled in by CMake). WorkerBin() is the environment's
// DISPATCHD_TEST_WORKER_BIN where set: another worker with dispatch-worker's command line (the
// Python SDK's reference worker runs the same tests that way).
std::string DispatchdBin();
std::string DispatchctlBin();
std::string WorkerBin();

// The whole file ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// A fresh directory under /tmp, removed with its contents on destruction. Mode 0755, so that an
// embedded PostgreSQL run as another user can reach below it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One principal of a tokens file: name, role, options (e.g. "types=echo").
struct TokenEntry {
  std::string name;
  std::string role;
  std::string options;
};

// Writes one token per entry to `<name>.token` in `dir` and, in one rename, the tokens file
// `tokens` there with their digests (mode 0600).
void WriteTokensFile(const TempDir& dir, const std::vector<TokenEntry>& entries);

// The token WriteTokensFile wrote for `name`, as the `authorization` metadata value.
std::string BearerOf(const TempDir& dir, const std::string& name);

// One job type line in a test config.
struct TypeSpec {
  std::string name;
  int max_concurrency = 0;  // 0: unset
  int max_attempts = 0;     // 0: unset
  std::string timeout;      // empty: unset
  std::string retry_backoff = "100ms";
  std::string on_orphan;  // empty: unset
};

struct DaemonOptions {
  std::string postgres_url;  // empty: embedded PostgreSQL under the state dir
  std::vector<TypeSpec> types = {{.name = "echo"}};
  std::string heartbeat_interval = "500ms";
  std::string worker_stale_after = "2s";
  std::string orphan_grace = "5s";
  int64_t max_payload_bytes = 65536;
  std::string postgres_yaml;  // more lines under `postgres:`, e.g. "  pool_size: 4\n"
  std::string extra_yaml;     // appended verbatim
};

// A dispatchd process with its own config and state directory.
class Daemon {
 public:
  // Writes the config and starts the daemon; returns once it serves (its ready file appeared).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options,
                                                       const TempDir& dir);
  ~Daemon();

  const std::string& address() const { return address_; }
  const std::string& config_path() const { return config_path_; }
  Process& process() { return *process_; }

  void Kill9();
  // SIGTERM, then wait for a clean exit; the exit code.
  absl::StatusOr<int> Terminate();
  // Kills the process if it runs and starts a new one on the same config, database and address.
  absl::Status Restart();

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::AdminService::Stub& admin() { return *admin_; }

  // Convenience calls with a deadline.
  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> Status(const std::string& job_id);
  absl::StatusOr<std::vector<v1::WorkerInfo>> Workers();
  absl::StatusOr<v1::StatsResponse> Stats();
  // The entry of Stats for job type `type`: NotFound if Stats has none for it.
  absl::StatusOr<v1::TypeStats> TypeStats(const std::string& type);
  // Waits until `n` workers are connected.
  bool WaitForWorkers(int n, absl::Duration timeout = absl::Seconds(30));
  // Waits until every job in `ids` is terminal; fills `out` with the final records.
  bool WaitForTerminal(const std::vector<std::string>& ids, std::vector<v1::Job>* out,
                       absl::Duration timeout);

  // host:port of its Prometheus endpoint (the harness asks for any free port), read from its
  // log; empty if it has not logged one within 10 s.
  std::string MetricsAddress();
  // The value of the sample named exactly `series` (name and labels as rendered, e.g.
  // `dispatchd_store_write_errors_total{kind="mark"}`) on its /metrics page now, or -1 if the
  // page or the sample is missing.
  double Metric(const std::string& series);

  // Runs dispatchctl against this daemon.
  CommandResult Ctl(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(60));

 private:
  Daemon() = default;
  absl::Status Launch();

  std::string dir_;
  std::string config_path_;
  std::string ready_path_;
  std::string address_;
  int generation_ = 0;
  std::unique_ptr<Process> process_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

struct WorkerOptions {
  std::string id;
  std::vector<std::string> types = {"echo"};
  int slots = 1;
  int max_concurrent = 0;                      // 0: unset (= slots)
  std::vector<std::string> mode = {"--echo"};  // e.g. {"--simulate", "100%:2s"}
};

// One line of a worker journal: `start job=J attempt=N ms=T` or `end job=J attempt=N ok=B ms=T`.
struct JournalEvent {
  bool start = false;
  std::string job_id;
  int attempt = 0;
  bool ok = false;
  int64_t ms = 0;
  std::string worker;  // which journal it came from
};

// A dispatch-worker process with a journal of the jobs it ran.
class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Start(const std::string& daemon_address,
                                                       const WorkerOptions& options,
                                                       const TempDir& dir);
  Process& process() { return *process_; }
  const std::string& journal_path() const { return journal_; }
  // Its journal as it stands (see JournalEvent), each event naming this worker.
  std::vector<JournalEvent> Journal() const;

 private:
  std::unique_ptr<Process> process_;
  std::string id_;
  std::string journal_;
};

std::vector<JournalEvent> ReadJournal(const std::string& path, const std::string& worker);
// The journals of `workers`, one after another.
std::vector<JournalEvent> Journals(const std::vector<std::unique_ptr<Worker>>& workers);
// Whether each job of `ids` started exactly once in `events` (the journals of every worker that
// could have run it) and, unless `others` is kMayStart, no other job started; if not, names each
// job that did not and how often it started.
enum class OtherJobs { kNone, kMayStart };
::testing::AssertionResult EachStartedOnce(const std::vector<JournalEvent>& events,
                                           const std::vector<std::string>& ids,
                                           OtherJobs others = OtherJobs::kNone);

// The largest number of jobs running at once according to the journals' start/end events.
int MaxConcurrent(std::vector<JournalEvent> events);
// The most of `jobs` that were running at once by the daemon's record: from started_at to
// finished_at (a job without either is left out).
int MostRunning(const std::vector<v1::Job>& jobs);

// A job spec with a type and a payload.
v1::JobSpec Spec(const std::string& type, const std::string& payload);

}  // namespace dispatchd::e2e
