// dispatch-worker: the reference dispatchd worker, built on the C++ worker SDK.
//
//   dispatch-worker --server 127.0.0.1:7411 --types echo --slots 2 --exec 'tr a-z A-Z'
//
// Modes: --echo (result = payload), --exec CMD (run `/bin/sh -c CMD` per job), --simulate MIX
// (sleep a duration drawn from a latency mix), --sleep-payload (sleep the duration the payload
// names). SIGTERM/SIGINT drain (running jobs finish, then exit 0); a second signal exits at once.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/cpp/latency_mix.h"
#include "client/cpp/security_flags.h"
#include "client/cpp/worker.h"

extern char** environ;

namespace dispatchd::client {
namespace {

constexpr size_t kMaxStderrMessage = 4096;
constexpr size_t kMaxStderrKept = 64 * 1024;
constexpr absl::Duration kKillGrace = absl::Seconds(2);

// Appends one line per job event, flushed at once. Thread-safe.
class Journal {
 public:
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "a");
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--journal: cannot open \"", path, "\": ", std::strerror(errno)));
    }
    return std::unique_ptr<Journal>(new Journal(f));
  }
  ~Journal() { std::fclose(file_); }

  void Start(const JobContext& job) ABSL_LOCKS_EXCLUDED(mu_) {
    Write(absl::StrCat("start job=", job.job_id(), " attempt=", job.attempt(),
                       " ms=", absl::ToUnixMillis(absl::Now()), "\n"));
  }
  void End(const JobContext& job, bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
    Write(absl::StrCat("end job=", job.job_id(), " attempt=", job.attempt(), " ok=", ok ? 1 : 0,
                       " ms=", absl::ToUnixMillis(absl::Now()), "\n"));
  }

 private:
  explicit Journal(FILE* f) : file_(f) {}
  void Write(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
  absl::Mutex mu_;
  FILE* const file_;
};

// Records when each job's handler starts, for latency measurements across processes: one line
// `JOB_ID ATTEMPT UNIX_MICROS` per job, the system clock (CLOCK_REALTIME) in microseconds since
// the epoch. Buffered and written out at exit, so that it costs a job next to nothing. Thread-safe.
class StartLog {
 public:
  static absl::StatusOr<std::unique_ptr<StartLog>> Open(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "a");
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--start-log: cannot open \"", path, "\": ", std::strerror(errno)));
    }
    std::setvbuf(f, nullptr, _IOFBF, 1 << 16);
    return std::unique_ptr<StartLog>(new StartLog(f));
  }
  ~StartLog() { std::fclose(file_); }

  void Record(const JobContext& job) ABSL_LOCKS_EXCLUDED(mu_) {
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    const std::string line = absl::StrCat(job.job_id(), " ", job.attempt(), " ", us, "\n");
    absl::MutexLock l(&mu_);
    std::fwrite(line.data(), 1, line.size(), file_);
  }

 private:
  explicit StartLog(FILE* f) : file_(f) {}
  absl::Mutex mu_;
  FILE* const file_;
};

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Reads what is available from `fd` into `buf`; false at EOF or on a hard error.
bool ReadAvailable(int fd, std::string& buf, size_t keep_tail) {
  char chunk[65536];
  while (true) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      if (keep_tail > 0 && buf.size() > keep_tail) buf.erase(0, buf.size() - keep_tail);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;
  }
}

// Runs `/bin/sh -c command` with the payload on stdin; stdout is the result. See --help.
JobOutcome RunExec(const std::string& command, int64_t max_output, JobContext& job) {
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return JobOutcome::Failure("pipe failed", true);
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return JobOutcome::Failure("pipe failed", true);
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return JobOutcome::Failure("pipe failed", true);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);  // its own process group, so cancel reaches grandchildren
  sigset_t none, defaults;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigdefault(&attr, &defaults);

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(absl::StrCat("DISPATCHD_JOB_ID=", job.job_id()));
  env_strings.push_back(absl::StrCat("DISPATCHD_ATTEMPT=", job.attempt()));
  env_strings.push_back(absl::StrCat("DISPATCHD_JOB_TYPE=", job.type()));
  env_strings.push_back(absl::StrCat("DISPATCHD_RESOURCE_ID=", job.resource_id()));
  env_strings.push_back(absl::StrCat("DISPATCHD_MODEL=", job.model()));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};

  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    for (int fd : {in[1], out[0], err[0]}) close(fd);
    return JobOutcome::Failure(absl::StrCat("spawn /bin/sh failed: ", std::strerror(rc)), true);
  }
  int stdin_fd = in[1], stdout_fd = out[0], stderr_fd = err[0];
  SetNonBlocking(stdin_fd);
  SetNonBlocking(stdout_fd);
  SetNonBlocking(stderr_fd);

  const std::string& payload = job.payload();
  size_t written = 0;
  if (payload.empty()) {
    close(stdin_fd);
    stdin_fd = -1;
  }
  std::string stdout_buf, stderr_buf;
  bool output_too_large = false;
  bool exited = false, cancelled = false, killed = false;
  int wstatus = 0;
  absl::Time exited_at, term_at;
  while (true) {
    if (exited && stdout_fd < 0 && stderr_fd < 0) break;
    // A grandchild may keep the pipes open after the shell exits: stop reading soon after.
    if (exited && absl::Now() - exited_at > absl::Milliseconds(200)) break;
    pollfd fds[3];
    int n = 0;
    if (stdin_fd >= 0) fds[n++] = {stdin_fd, POLLOUT, 0};
    if (stdout_fd >= 0) fds[n++] = {stdout_fd, POLLIN, 0};
    if (stderr_fd >= 0) fds[n++] = {stderr_fd, POLLIN, 0};
    poll(fds, static_cast<nfds_t>(n), 50);
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == stdin_fd) {
        ssize_t w = write(stdin_fd, payload.data() + written, payload.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == payload.size()) {
          close(stdin_fd);  // done, or the child stopped reading (EPIPE)
          stdin_fd = -1;
        }
      } else if (fds[i].fd == stdout_fd) {
        if (!ReadAvailable(stdout_fd, stdout_buf, 0)) {
          close(stdout_fd);
          stdout_fd = -1;
        }
        if (static_cast<int64_t>(stdout_buf.size()) > max_output) {
          output_too_large = true;
          stdout_buf.clear();
        }
      } else if (fds[i].fd == stderr_fd) {
        if (!ReadAvailable(stderr_fd, stderr_buf, kMaxStderrKept)) {
          close(stderr_fd);
          stderr_fd = -1;
        }
      }
    }
    absl::Time now = absl::Now();
    if (!cancelled && job.cancelled()) {
      cancelled = true;
      term_at = now;
      kill(-pid, SIGTERM);
    }
    if (cancelled && !killed && now - term_at >= kKillGrace) {
      killed = true;
      kill(-pid, SIGKILL);
    }
    if (!exited) {
      pid_t r = waitpid(pid, &wstatus, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) {
        exited = true;
        exited_at = now;
        if (stdin_fd >= 0) {
          close(stdin_fd);
          stdin_fd = -1;
        }
      }
    }
  }
  for (int fd : {stdin_fd, stdout_fd, stderr_fd}) {
    if (fd >= 0) close(fd);
  }

  std::string message(absl::StripAsciiWhitespace(stderr_buf));
  if (message.size() > kMaxStderrMessage) {
    message = message.substr(message.size() - kMaxStderrMessage);
  }
  if (cancelled) {
    return JobOutcome::Failure(absl::StrCat("cancelled: ", job.cancel_reason()), false);
  }
  if (WIFSIGNALED(wstatus)) {
    return JobOutcome::Failure(absl::StrCat(message, message.empty() ? "" : " ",
                                            "(killed by signal ", WTERMSIG(wstatus), ")"),
                               false);
  }
  int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  if (code != 0) {
    return JobOutcome::Failure(
        absl::StrCat(message, message.empty() ? "" : " ", "(exit status ", code, ")"),
        code == 75 /* EX_TEMPFAIL */);
  }
  if (output_too_large) {
    return JobOutcome::Failure(absl::StrCat("output exceeds ", max_output, " bytes"), false);
  }
  return JobOutcome::Success(std::move(stdout_buf));
}

// Simulated jobs: a latency draw per job, plus a model-load delay when the model changes.
class Simulator {
 public:
  Simulator(LatencyMix mix, absl::Duration model_load_delay, uint64_t seed)
      : mix_(std::move(mix)), model_load_delay_(model_load_delay), rng_(seed) {}

  JobOutcome Run(JobContext& job, Worker* worker) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Duration sleep;
    bool load = false;
    {
      absl::MutexLock l(&mu_);
      sleep = mix_.Sample(rng_);
      if (!job.model().empty() && job.model() != loaded_model_) {
        loaded_model_ = job.model();
        load = model_load_delay_ > absl::ZeroDuration();
      }
    }
    if (!job.model().empty() && worker != nullptr) worker->SetModelsResident({job.model()});
    if (load && job.WaitForCancellation(model_load_delay_)) {
      return JobOutcome::Failure(absl::StrCat("cancelled: ", job.cancel_reason()), false);
    }
    if (job.WaitForCancellation(sleep)) {
      return JobOutcome::Failure(absl::StrCat("cancelled: ", job.cancel_reason()), false);
    }
    return JobOutcome::Success(absl::StrCat("simulated ", absl::FormatDuration(sleep)));
  }

 private:
  const LatencyMix mix_;
  const absl::Duration model_load_delay_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::string loaded_model_ ABSL_GUARDED_BY(mu_);
};

// --sleep-payload: the payload names the job's duration (`2.5s`, `1500ms`), so that a benchmark
// decides each job's length itself and can compare runs on the same jobs.
JobOutcome RunSleepPayload(JobContext& job) {
  absl::Duration sleep;
  const std::string text(absl::StripAsciiWhitespace(job.payload()));
  if (!absl::ParseDuration(text, &sleep) || sleep < absl::ZeroDuration() ||
      sleep == absl::InfiniteDuration()) {
    return JobOutcome::Failure(
        absl::StrCat("--sleep-payload: payload \"", text.substr(0, 64), "\" is not a duration"),
        false);
  }
  if (job.WaitForCancellation(sleep)) {
    return JobOutcome::Failure(absl::StrCat("cancelled: ", job.cancel_reason()), false);
  }
  return JobOutcome::Success(absl::StrCat("slept ", absl::FormatDuration(sleep)));
}

std::string DefaultId() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  return absl::StrCat(host, ":", getpid());
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "dispatch-worker: %s\nRun with --help for more information.\n",
               message.c_str());
  return 2;
}

int Main(int argc, char** argv) {
  // Signals are taken by a dedicated thread: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{"dispatch-worker: the reference dispatchd worker (one WorkerService stream)."};
  const char* env_server = std::getenv("DISPATCHD_SERVER");
  std::string server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:7411";
  std::string id = DefaultId();
  std::string types_flag, labels_flag, journal_path, log_level = "info";
  int slots = 1, max_concurrent = 0;
  bool echo = false;
  std::string exec_cmd, simulate_spec, model_load_delay_flag = "0s";
  uint64_t seed = 0;
  bool seed_set = false;

  app.set_version_flag("--version", "dispatch-worker " DISPATCHD_VERSION,
                       "Print the version and exit");
  app.add_option("--server", server,
                 "Daemon address host:port, or several comma-separated (a standby sends the worker "
                 "to the leader) (env DISPATCHD_SERVER)")
      ->capture_default_str();
  Security security;
  AddSecurityFlags(app, &security);
  app.add_option("--id", id, "Worker id, unique in the fleet (default hostname:pid)");
  app.add_option("--types", types_flag, "Job types served, comma-separated")->required();
  app.add_option("--slots", slots, "Slots advertised to the daemon")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-concurrent", max_concurrent,
                 "Jobs held at once; more are refused RESOURCE_EXHAUSTED (default: --slots)")
      ->check(CLI::PositiveNumber);
  app.add_option("--labels", labels_flag, "Placement labels k=v,k2=v2");
  std::string memory_file;
  app.add_option("--memory-file", memory_file,
                 "Report memory use from this file instead of /proc/meminfo and NVML: one line "
                 "`RAM_USED RAM_TOTAL [GPU_USED]` in bytes (GPU_USED: of the first GPU), re-read "
                 "at each heartbeat (for an external monitor, or to test memory throttling)");
  double gpu_memory_gb = 0;
  app.add_option("--gpu-memory-gb", gpu_memory_gb,
                 "Report one GPU with this much memory (GB) instead of the GPUs NVML reads: the "
                 "daemon then loads only models whose vram_gb fit in it")
      ->check(CLI::NonNegativeNumber);
  bool no_nvml = false;
  app.add_flag("--no-nvml", no_nvml,
               "Do not read GPUs from NVML (libnvidia-ml.so.1, or env DISPATCHD_NVML_LIBRARY): "
               "report none unless --gpu-memory-gb names one (default: the GPUs NVML lists that "
               "CUDA_VISIBLE_DEVICES leaves visible, with their memory)");
  app.add_option("--journal", journal_path,
                 "Append `start job=J attempt=N ms=T` / `end job=J attempt=N ok=0|1 ms=T` lines");
  std::string start_log_path;
  app.add_option("--start-log", start_log_path,
                 "Append `JOB_ID ATTEMPT UNIX_MICROS` when a job's handler starts (system clock; "
                 "buffered, written out at exit): for latency measurements, see bench/README.md");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  auto* echo_opt = app.add_flag("--echo", echo,
                                "Result = payload (the default mode; its jobs run on the thread "
                                "that reads the daemon's stream, where the other modes run each "
                                "job on a thread of its own)");
  auto* exec_opt = app.add_option(
      "--exec", exec_cmd,
      "Run `/bin/sh -c CMD` per job: payload on stdin, stdout is the result; non-zero exit fails "
      "with stderr as the message (exit 75 = retryable); job env DISPATCHD_JOB_ID, "
      "DISPATCHD_ATTEMPT, DISPATCHD_JOB_TYPE, DISPATCHD_RESOURCE_ID, DISPATCHD_MODEL");
  auto* sim_opt = app.add_option(
      "--simulate", simulate_spec,
      "Sleep a duration drawn from a latency mix, e.g. '95%:1s-5s,5%:20s-40s' or '100%:2s'");
  echo_opt->excludes(exec_opt)->excludes(sim_opt);
  exec_opt->excludes(sim_opt);
  bool sleep_payload = false;
  app.add_flag("--sleep-payload", sleep_payload,
               "Sleep the duration the job's payload names, e.g. '2.5s' or '1500ms' (a payload "
               "that is not a duration fails the job, not retryable)")
      ->excludes(echo_opt)
      ->excludes(exec_opt)
      ->excludes(sim_opt);
  app.add_option("--model-load-delay", model_load_delay_flag,
                 "--simulate: extra delay when a job's model differs from the last loaded one")
      ->capture_default_str();
  app.add_option("--seed", seed, "--simulate: random seed (default: random)")
      ->each([&](const std::string&) { seed_set = true; });
  app.footer(
      "Exit status: 0 after a drain (SIGTERM/SIGINT, or the daemon's Drain); 1 on a startup "
      "failure; 2 on a usage error; 128+signal on a second signal.\n"
      "Example: dispatch-worker --server 127.0.0.1:7411 --types echo --slots 2 --exec 'tr a-z "
      "A-Z'");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  static const std::vector<std::string> kLevels = {"trace", "debug",    "info", "warn",
                                                   "error", "critical", "off"};
  if (std::find(kLevels.begin(), kLevels.end(), log_level) == kLevels.end()) {
    return UsageError(absl::StrCat("--log-level: unknown level \"", log_level, "\""));
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Everything logs to stderr through the SDK's "worker" logger (created here, found by the SDK).
  std::shared_ptr<spdlog::logger> log = spdlog::get("worker");
  if (log == nullptr) log = spdlog::stderr_color_mt("worker");

  WorkerOptions options;
  options.server = server;
  options.security = security;
  options.worker_id = id;
  for (absl::string_view t : absl::StrSplit(types_flag, ',', absl::SkipWhitespace())) {
    options.types.emplace_back(absl::StripAsciiWhitespace(t));
  }
  if (options.types.empty()) return UsageError("--types: at least one type is required");
  options.slots = slots;
  if (!memory_file.empty()) {
    options.memory_probe = [memory_file] {
      WorkerOptions::MemoryReport r;
      std::ifstream in(memory_file);
      int64_t gpu_used = 0;
      in >> r.ram_used_bytes >> r.ram_total_bytes;
      if (in >> gpu_used) r.gpu_used_bytes.push_back(gpu_used);
      return r;
    };
  }
  options.nvml = !no_nvml;
  if (gpu_memory_gb > 0) {
    options.gpus.push_back(
        {.id = "0", .memory_total_bytes = static_cast<int64_t>(gpu_memory_gb * 1e9)});
  }
  options.max_concurrent = max_concurrent;
  for (absl::string_view kv : absl::StrSplit(labels_flag, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    absl::string_view k = absl::StripAsciiWhitespace(p.first);
    if (k.empty() || kv.find('=') == absl::string_view::npos) {
      return UsageError(absl::StrCat("--labels: \"", kv, "\" is not k=v"));
    }
    options.labels[std::string(k)] = std::string(absl::StripAsciiWhitespace(p.second));
  }
  absl::Duration model_load_delay;
  if (!absl::ParseDuration(model_load_delay_flag, &model_load_delay) ||
      model_load_delay < absl::ZeroDuration()) {
    return UsageError(
        absl::StrCat("--model-load-delay: invalid duration \"", model_load_delay_flag, "\""));
  }

  std::unique_ptr<Journal> journal;
  if (!journal_path.empty()) {
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(journal_path);
    if (!j.ok()) return UsageError(std::string(j.status().message()));
    journal = *std::move(j);
  }

  std::unique_ptr<StartLog> start_log;
  if (!start_log_path.empty()) {
    absl::StatusOr<std::unique_ptr<StartLog>> l = StartLog::Open(start_log_path);
    if (!l.ok()) return UsageError(std::string(l.status().message()));
    start_log = *std::move(l);
  }

  // The mode.
  Worker* worker_ptr = nullptr;
  std::function<JobOutcome(JobContext&)> run;
  std::unique_ptr<Simulator> simulator;
  const int64_t max_output = options.max_output_bytes;
  if (sleep_payload) {
    run = RunSleepPayload;
  } else if (!exec_cmd.empty()) {
    run = [exec_cmd, max_output](JobContext& job) { return RunExec(exec_cmd, max_output, job); };
  } else if (sim_opt->count() > 0) {
    absl::StatusOr<LatencyMix> mix = ParseLatencyMix(simulate_spec);
    if (!mix.ok()) return UsageError(absl::StrCat("--simulate: ", mix.status().message()));
    if (!seed_set) seed = std::random_device{}();
    simulator = std::make_unique<Simulator>(*std::move(mix), model_load_delay, seed);
    run = [&simulator, &worker_ptr](JobContext& job) { return simulator->Run(job, worker_ptr); };
  } else if (exec_opt->count() > 0) {
    return UsageError("--exec: empty command");
  } else {
    run = [](JobContext& job) { return JobOutcome::Success(job.payload()); };
    // A copy never waits: the jobs run on the stream's thread, with no hand-off to another.
    options.run_inline = true;
  }
  Handler handler = [&journal, &start_log, run](JobContext& job) {
    if (start_log != nullptr) start_log->Record(job);
    if (journal != nullptr) journal->Start(job);
    JobOutcome outcome = run(job);
    if (journal != nullptr) journal->End(job, outcome.ok);
    return outcome;
  };

  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Create(options, std::move(handler));
  if (!worker.ok()) return UsageError(std::string(worker.status().message()));
  worker_ptr = worker->get();

  std::thread([w = worker_ptr, signals, log] {
    int count = 0;
    while (true) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (++count == 1) {
        log->info("signal={}: draining (send again to exit at once)", sig);
        w->Drain();
      } else {
        log->warn("signal={}: exiting now", sig);
        std::fflush(nullptr);
        _exit(128 + sig);
      }
    }
  }).detach();

  absl::Status done = (*worker)->Run();
  if (!done.ok()) {
    log->error("worker stopped: {}", done.ToString());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dispatchd::client

int main(int argc, char** argv) {
  // Abseil's lock-order graph costs CPU on every Mutex operation of every job; the SDK's tests
  // keep it and catch cycles there.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return dispatchd::client::Main(argc, argv);
}
