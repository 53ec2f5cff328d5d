#pragma once

// C++ worker SDK: serves dispatchd jobs over one WorkerService.Connect stream.
//
//   absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Create(
//       {.server = "127.0.0.1:7411", .worker_id = "gpu-1", .types = {"llm.embed"}},
//       [](JobContext& job) { return JobOutcome::Success(Embed(job.payload())); });
//   absl::Status done = (*w)->Run();  // until Shutdown() or Drain() from any thread
//
// The worker is the authority on its own capacity: an assignment is accepted only while fewer than
// `max_concurrent` jobs execute, and refused RESOURCE_EXHAUSTED otherwise, whatever the daemon
// believes. Each handler runs on a thread of its own while it runs (threads are reused; see
// WorkerOptions::run_inline for handlers that never wait). Results
// are kept until the daemon acknowledges them and are sent again after every reconnect; jobs keep
// running while the stream is down, and the worker reconnects with jittered exponential backoff
// until Shutdown().

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "client/cpp/credentials.h"
#include "client/cpp/worker_handler_pool.h"
#include "client/cpp/worker_result_ledger.h"
#include "client/cpp/worker_session.h"
#include "dispatchd/v1/worker_service.grpc.pb.h"

namespace dispatchd::client {

namespace v1 = ::dispatchd::v1;

namespace worker_internal {
class GpuSource;  // worker_memory_probe.h, which includes this header
}  // namespace worker_internal

struct WorkerOptions {
  // Daemon address, host:port; or several, comma-separated, for daemons sharing one database.
  // The worker connects to the first; a standby answers with the leader's address (Redirect) and
  // the worker goes there; after a failed attempt it tries the next address in the list.
  std::string server;
  // Stable identity, unique in the fleet (e.g. host:pid).
  std::string worker_id;
  // Job types served; at least one.
  std::vector<std::string> types;
  // Slots advertised in Hello; at least 1.
  int slots = 1;
  // Backpressure limit on jobs executing at once; 0 means `slots`.
  int max_concurrent = 0;
  // Runs each handler on the thread that reads the stream instead of a thread of its own: the
  // jobs of one Assign one after another, their results then sent together. For handlers that
  // return at once and never wait (an echo, a lookup, a hand-off to a queue of the caller's own),
  // it saves two thread hand-offs per job. While a handler runs the worker reads nothing, so
  // cancels and new assignments wait for it (heartbeats do not): a handler that blocks holds up
  // every job of the worker.
  bool run_inline = false;
  // Placement labels.
  std::map<std::string, std::string> labels;
  // TLS and the bearer token (see Security); none by default.
  Security security;
  // Models loaded at start (see Worker::SetModelsResident to change them later).
  std::vector<std::string> models_resident;
  // GPUs on this host, reported in Hello and heartbeats. The daemon places a model on this
  // worker only if the VRAM of its models fits in their total memory; none reported: no limit.
  // Empty (the default): the GPUs NVML reads, if `nvml`.
  struct Gpu {
    std::string id;
    int64_t memory_total_bytes = 0;
  };
  std::vector<Gpu> gpus;
  // When `gpus` is empty, read the GPUs (those CUDA_VISIBLE_DEVICES leaves visible) and their
  // memory from NVML: libnvidia-ml.so.1, or the library the environment's
  // DISPATCHD_NVML_LIBRARY names, loaded at run time. Hello then reports each GPU's name, UUID
  // and memory, and each heartbeat its memory in use and the part this process and its children
  // hold. Without the library, a driver or a GPU, the worker reports none and logs why, once.
  bool nvml = true;
  // Memory reported in heartbeats. Default (unset): host RAM from /proc/meminfo, and GPU use from
  // NVML (none without it). Set: RAM and, per entry of the GPUs reported, the GPU use it gives.
  // The daemon stops sending jobs to a worker whose use passes its throttle thresholds.
  struct MemoryReport {
    int64_t ram_used_bytes = 0;
    int64_t ram_total_bytes = 0;
    std::vector<int64_t> gpu_used_bytes;  // per entry of `gpus`
  };
  std::function<MemoryReport()> memory_probe;
  // Reconnect backoff bounds (exponential with jitter).
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
  // How long to wait for Welcome after Hello before the attempt counts as failed.
  absl::Duration welcome_timeout = absl::Seconds(30);
  // Heartbeat interval used when Welcome does not name one.
  absl::Duration default_heartbeat_interval = absl::Seconds(5);
  // After a drain, how long to keep trying to deliver unacknowledged results once no job runs.
  absl::Duration drain_result_timeout = absl::Seconds(30);
  // Outputs larger than this are reported as a non-retryable failure instead (the daemon's gRPC
  // message limit would otherwise refuse the Result, again after every reconnect).
  int64_t max_output_bytes = 4 * 1024 * 1024 - 64 * 1024;
};

// What a handler sees of its job, and its cancellation signal.
// Thread-safe: the SDK cancels it from the stream's thread while the handler reads it.
class JobContext {
 public:
  explicit JobContext(v1::Assignment assignment);
  JobContext(const JobContext&) = delete;
  JobContext& operator=(const JobContext&) = delete;

  const std::string& job_id() const { return assignment_.job_id(); }
  int attempt() const { return assignment_.attempt(); }
  const std::string& type() const { return assignment_.type(); }
  const std::string& payload() const { return assignment_.payload(); }
  const std::string& resource_id() const { return assignment_.resource_id(); }
  const std::string& model() const { return assignment_.model(); }
  // When this attempt times out (the daemon cancels it then); InfiniteFuture if unset.
  absl::Time deadline() const { return deadline_; }
  const v1::Assignment& assignment() const { return assignment_; }

  // True once the daemon cancelled the job (client cancel, timeout, not re-adopted) or the worker
  // shuts down. The handler decides what to do; whatever it returns is still reported.
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until cancelled or `timeout` passes; returns cancelled().
  bool WaitForCancellation(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  // Why it was cancelled (empty while it is not).
  std::string cancel_reason() const ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the job; idempotent (the first reason wins). Called by the SDK.
  void Cancel(absl::string_view reason) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const v1::Assignment assignment_;
  const absl::Time deadline_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
};

// The outcome a handler returns: success with output bytes, or failure with a message.
struct JobOutcome {
  static JobOutcome Success(std::string output) { return {true, std::move(output), {}, false}; }
  static JobOutcome Failure(std::string message, bool retryable) {
    return {false, {}, std::move(message), retryable};
  }

  bool ok = false;
  std::string output;   // when ok
  std::string message;  // when !ok
  bool retryable = false;
};

// Runs one job. Called on a thread of its own; may block for as long as the job takes (with
// WorkerOptions::run_inline, on the stream's reader: it must not block).
using Handler = std::function<JobOutcome(JobContext&)>;

// Serves jobs to the daemon. Run() blocks; Drain() and Shutdown() are thread-safe and may be
// called from any thread (a signal-handling thread, a handler) before, during or after Run().
class Worker {
 public:
  // INVALID_ARGUMENT (naming the field) for an empty server, worker_id or type list, slots < 1,
  // max_concurrent < 0, a null handler, or non-positive backoff bounds.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options, Handler handler);

  // Shuts down and waits for every handler thread (handlers see cancelled()).
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Connects, serves and reconnects until Shutdown() or a completed drain; then OK.
  // FAILED_PRECONDITION if called twice.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops taking work: tells the daemon (Draining), refuses new assignments with REASON_DRAINING,
  // lets running jobs finish and their results be acknowledged (up to drain_result_timeout), then
  // Run() returns. Idempotent.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops now: cancels running jobs, closes the stream, and Run() returns (with run_inline, once
  // the handlers of the Assign being run have returned; they see cancelled()). Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces the models reported as resident in heartbeats (and the next Hello).
  void SetModelsResident(std::vector<std::string> models) ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs executing now (including any whose result will be dropped).
  int RunningJobsForTest() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using JobKey = worker_internal::JobKey;
  using Session = worker_internal::Session;

  // A job whose handler has not returned. Fields other than `key` and `context` are guarded by
  // mu_.
  struct RunningJob {
    JobKey key;
    std::shared_ptr<JobContext> context;
    // Not re-adopted after a reconnect: cancelled, and its outcome is not reported.
    bool drop_result = false;
  };

  Worker(WorkerOptions options, Handler handler);

  bool DrainDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sessions (worker_session.cc; Run() is there too).
  // How a connection attempt ended.
  enum class SessionEnd { kFailed, kWelcomed, kDaemonStopped, kRedirected, kRefused };
  // One connection attempt to `target`: Hello, Welcome, then messages until the stream ends. On
  // kDaemonStopped the daemon said it was stopping (Stopping) before the stream ended. On
  // kRedirected, `*redirect_to` is the leader's address (empty if the standby knew none). On
  // kRefused (the daemon does not know these credentials, or they may not serve these types:
  // trying again cannot help), `*refusal` says why.
  SessionEnd RunSession(const std::string& target, const Credentials& credentials,
                        std::string* redirect_to, absl::Status* refusal) ABSL_LOCKS_EXCLUDED(mu_);
  void HandleWelcome(const std::shared_ptr<Session>& session, const v1::Welcome& welcome)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Heartbeats and the welcome and drain watchdogs of one session.
  void SessionTimerLoop(std::shared_ptr<Session> session) ABSL_LOCKS_EXCLUDED(mu_);
  v1::WorkerMessage HeartbeatLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lists the jobs this worker holds, as Hello and heartbeats report them: those running (but
  // not those dropped), then those finished whose results are not acknowledged yet.
  void AddHeldJobsLocked(google::protobuf::RepeatedPtrField<v1::HeldJob>* held) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Jobs (worker_handler_pool.cc).
  // Answers each assignment, decided one by one against the jobs running and max_concurrent_,
  // and hands each job accepted to handlers_, with its assignment, moved out of `assign` (or,
  // with run_inline, runs them here once their answers are written).
  void HandleAssign(const std::shared_ptr<Session>& session, v1::Assign* assign)
      ABSL_LOCKS_EXCLUDED(mu_);
  void HandleCancel(const v1::CancelJob& cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one job's handler and reports its outcome (RunHandler, FinishJob, then the result sent).
  void RunJob(std::shared_ptr<RunningJob> job) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs one job's handler: its Result, a failure if the handler threw or its output is too large.
  v1::Result RunHandler(RunningJob& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a job whose handler returned out of running_ and keeps its result until acknowledged.
  // Returns the session to send the result on, or null (dropped, or no session welcomed: it goes
  // after the next Welcome); `*others_running` says whether other jobs still run.
  std::shared_ptr<Session> FinishJob(const RunningJob& job, const v1::Result& result,
                                     bool* others_running) ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerOptions options_;
  const Handler handler_;
  const int max_concurrent_;
  const absl::flat_hash_set<std::string> types_;
  const std::vector<std::string> servers_;  // options_.server split at commas
  // The GPUs that Hello and heartbeats report (from options_ or NVML).
  const std::unique_ptr<worker_internal::GpuSource> gpus_;

  mutable absl::Mutex mu_;
  bool run_called_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // When the drain found no job running (InfiniteFuture before).
  absl::Time jobs_done_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<std::string> models_resident_ ABSL_GUARDED_BY(mu_);
  // The open session, and whether its Welcome arrived (results are written only then).
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_);
  // Jobs whose handler has not returned yet.
  std::map<JobKey, std::shared_ptr<RunningJob>> running_ ABSL_GUARDED_BY(mu_);
  // Results sent (or to send) and not yet acknowledged.
  worker_internal::ResultLedger results_ ABSL_GUARDED_BY(mu_);

  // The threads that run RunJob (none with run_inline); handed jobs with mu_ held (its lock is
  // taken after mu_, never before it). Declared last so that it is destroyed first: its destructor
  // joins the threads, which use the members above until their last job returns.
  worker_internal::HandlerPool handlers_;
};

}  // namespace dispatchd::client
