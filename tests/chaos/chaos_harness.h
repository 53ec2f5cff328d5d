#pragma once

// Chaos harness: a PostgreSQL server of the test's own (one fault restarts it), a continuous
// Submit load from several clients, a submit flood, a clock for the recovery after a fault, and
// the checker that reads the database, the daemons' logs and the workers' journals to count jobs
// lost, completed twice or run twice at one attempt. Built on tests/e2e/harness.h: real processes
// on 127.0.0.1, every wait bounded.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dispatchd::chaos {

// The job type every chaos job has.
inline constexpr char kChaosType[] = "chaos";

// A private PostgreSQL 15 server run by tests/pg/pg_fixture.sh with its state under `state_dir`,
// stopped (and its data removed) on destruction, also when the test fails.
//
//   absl::StatusOr<std::unique_ptr<PrivatePostgres>> pg = PrivatePostgres::Start(dir.File("pg"));
//
// Thread-compatible.
class PrivatePostgres {
 public:
  static absl::StatusOr<std::unique_ptr<PrivatePostgres>> Start(std::string state_dir);
  ~PrivatePostgres();
  PrivatePostgres(const PrivatePostgres&) = delete;
  PrivatePostgres& operator=(const PrivatePostgres&) = delete;

  // libpq URL of its `postgres` database.
  const std::string& url() const { return url_; }
  // A fast shutdown (every session is cut) and a start on the same port and data; returns once
  // the server accepts connections again.
  absl::Status Restart();

 private:
  explicit PrivatePostgres(std::string state_dir) : state_dir_(std::move(state_dir)) {}

  std::string state_dir_;
  std::string url_;
};

// Runs `sql` on a fresh connection to `url` and returns the rows as text (NULL as ""); Unavailable
// when the server cannot be reached, Internal for any other database error.
absl::StatusOr<std::vector<std::vector<std::string>>> Query(const std::string& url,
                                                            const std::string& sql);

// Ids of the jobs that are QUEUED, DISPATCHED or RUNNING now.
absl::StatusOr<std::set<std::string>> ActiveJobs(const std::string& url);

// The worker with the most RUNNING jobs and how many it runs; nullopt if none runs any.
std::optional<std::pair<std::string, int>> BusiestWorker(const std::string& url);

// Waits (at most `timeout`) until no job is QUEUED, DISPATCHED or RUNNING.
bool WaitUntilNoActiveJobs(const std::string& url, absl::Duration timeout);

// The log files of the daemon whose directory is `dir` (dispatchd.1.log, dispatchd.2.log, ...:
// one per start), in start order.
std::vector<std::string> DaemonLogFiles(const std::string& dir);

// How many times `needle` occurs in those log files, all together.
int64_t DaemonLogCount(const std::string& dir, const std::string& needle);
inline bool DaemonLogContains(const std::string& dir, const std::string& needle) {
  return DaemonLogCount(dir, needle) > 0;
}

// The contents of the newest of those log files (the running process's), or "".
std::string LatestDaemonLog(const std::string& dir);

struct LoadOptions {
  // Daemons the clients submit to; each client goes through them in turn.
  std::vector<std::string> addresses;
  int clients = 4;
  // Per client.
  int jobs_per_second = 10;
  absl::Duration submit_deadline = absl::Seconds(5);
};

// The continuous load: `clients` threads, each with its own fairness_key (`client-N`) and its own
// channels, each submitting a `chaos` job over gRPC every 1/jobs_per_second with a deadline. A
// failed Submit is not an accepted job: it is counted, and the client carries on with new submits
// at its pace, through any outage.
//
//   Load load({.addresses = {daemon->address()}});
//   load.Start();  ...  load.Stop();
//
// Thread-safe. Stops on destruction.
class Load {
 public:
  explicit Load(LoadOptions options) : options_(std::move(options)) {}
  ~Load();
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

  // REQUIRES: not started yet.
  void Start();
  // Stops the clients and waits for their last Submit to return.
  void Stop();

  // Ids of the jobs whose Submit returned OK.
  std::vector<std::string> accepted() const ABSL_LOCKS_EXCLUDED(mu_);
  // Submits that did not return OK.
  int64_t errors() const ABSL_LOCKS_EXCLUDED(mu_);
  // Refusals (RESOURCE_EXHAUSTED) among them, and how many of those lacked a `retry-after-ms`
  // trailer.
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t refused_without_retry_after() const ABSL_LOCKS_EXCLUDED(mu_);
  // The errors by gRPC code, e.g. "UNAVAILABLE:12 DEADLINE_EXCEEDED:1".
  std::string ErrorSummary() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void RunClient(int client);

  const LoadOptions options_;
  std::vector<std::thread> threads_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> accepted_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> errors_by_code_ ABSL_GUARDED_BY(mu_);
  int64_t refused_without_retry_after_ ABSL_GUARDED_BY(mu_) = 0;
};

struct FloodResult {
  std::vector<std::string> accepted;
  // RESOURCE_EXHAUSTED answers, and how many of them lacked a `retry-after-ms` trailer.
  int64_t refused = 0;
  int64_t refused_without_retry_after = 0;
  // Any other failure, and the first of them.
  int64_t other_errors = 0;
  std::string first_other_error;
};

// Sends `total` Submits of `chaos` jobs to `address` from `threads` threads, each of which issues
// its share all at once (asynchronously) and waits for every answer (each call has `deadline`).
FloodResult Flood(const std::string& address, int threads, int total, absl::Duration deadline);

// Counts the active jobs (QUEUED, DISPATCHED or RUNNING) in the database every `period` on a
// thread of its own, from construction until Stop() or destruction; samples that fail (database
// down) are skipped. Thread-safe.
class ActiveCountSampler {
 public:
  ActiveCountSampler(std::string url, absl::Duration period);
  ~ActiveCountSampler();
  ActiveCountSampler(const ActiveCountSampler&) = delete;
  ActiveCountSampler& operator=(const ActiveCountSampler&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // The largest count seen, and how many samples were taken.
  int64_t most() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t samples() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run(absl::Duration period) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string url_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t most_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// Measures the recovery after a fault: from the fault until every job that was active just before
// it, or when it was over, has ended. A thread polls the database every 100 ms, riding out any
// outage, until then.
//
//   RecoveryClock clock(url, *ActiveJobs(url), absl::Now());  Inject();
//   clock.AddActive(*ActiveJobs(url));  // once the fault is over (a restart returned)
//
// Thread-safe.
class RecoveryClock {
 public:
  // `active`: the jobs active just before the fault (ActiveJobs), which began at `fault_at`.
  RecoveryClock(std::string url, std::set<std::string> active, absl::Time fault_at);
  ~RecoveryClock();
  RecoveryClock(const RecoveryClock&) = delete;
  RecoveryClock& operator=(const RecoveryClock&) = delete;

  // Also waits for `active`, the jobs active when a lasting fault (an outage, a frozen process)
  // was over: those it held up recover only then.
  void AddActive(const std::set<std::string>& active) ABSL_LOCKS_EXCLUDED(mu_);
  // Seconds from the fault until all those jobs had ended; nullopt while some have not.
  std::optional<double> seconds() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time fault_at() const { return fault_at_; }

 private:
  void Poll() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string url_;
  const absl::Time fault_at_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<double> seconds_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// What a chaos test gathered: the database, the accepted jobs, and the files to check.
struct Evidence {
  std::string db_url;
  std::vector<std::string> accepted;
  // Every log file of every daemon of the test (DaemonLogFiles).
  std::vector<std::string> daemon_logs;
  // (worker id, journal path) of every worker that ran, killed ones included.
  std::vector<std::pair<std::string, std::string>> journals;
};

// The checker's counts; all but `accepted`, `logged_completions`, `reruns` and
// `reran_after_success` (see there) must be 0.
struct Verdict {
  int64_t accepted = 0;
  // Accepted jobs missing from the database or not in a terminal state.
  int64_t lost = 0;
  // Rows of any job (accepted or not) still QUEUED, DISPATCHED or RUNNING.
  int64_t left_active = 0;
  // Jobs with more than one `finished job=` line (one per committed terminal transition) across
  // the daemons' logs; and lines naming another state than the row's.
  int64_t duplicate_completions = 0;
  int64_t log_disagrees_with_db = 0;
  int64_t logged_completions = 0;
  // (job, attempt) pairs started more than once, on one worker or on several (journals).
  int64_t ran_twice_same_attempt = 0;
  // SUCCEEDED rows whose (job, attempt) no journal started.
  int64_t succeeded_not_run = 0;
  // Jobs started at more than one attempt: at-least-once execution after a lost worker (allowed).
  int64_t reruns = 0;
  // Jobs started again at a higher attempt after a worker had ended an attempt successfully. Only
  // a worker lost before its result was recorded excuses that; with every worker alive, the
  // daemon dropped a success it had been sent.
  int64_t reran_after_success = 0;
  // Jobs per terminal state, e.g. {"SUCCEEDED": 812}.
  std::map<std::string, int64_t> by_state;
  // The first few problems, one line each, for the failure message.
  std::vector<std::string> problems;
};

absl::StatusOr<Verdict> Check(const Evidence& evidence);

// The report: a header, and one greppable row per fault, e.g.
//   chaos | fault=worker_kill9 | accepted=812 | lost=0 | duplicate_completions=0 |
//   ran_twice_same_attempt=0 | recovery_s=3.4 | submit_errors=0
// (one line), then `extra` fields in order.
std::string ReportHeader();
std::string ReportRow(const std::string& fault, const Verdict& verdict,
                      std::optional<double> recovery_s, int64_t submit_errors,
                      const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace dispatchd::chaos
