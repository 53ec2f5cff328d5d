#include "tests/e2e/harness.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/cpp/dispatch_client.h"
#include "server/auth/grpc_auth.h"

extern char** environ;

namespace dispatchd::e2e {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

std::vector<char*> Argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const std::string& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                        const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  std::vector<char*> args = Argv(argv);
  int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("spawn ", argv[0], ": ", std::strerror(rc)));
  }
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() {
  if (Running()) {
    kill(-pid_, SIGKILL);
    Wait(absl::Seconds(10)).IgnoreError();
  }
}

bool Process::Running() {
  if (reaped_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  if (!WaitFor([this] { return !Running(); }, timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
  }
  return exit_code_;
}

std::string Process::Log() const { return ReadFile(log_path_); }

CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::string& stdin_data) {
  CommandResult result;
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    result.err = "pipe failed";
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  pid_t pid = 0;
  std::vector<char*> args = Argv(argv);
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    close(err[0]);
    result.err = absl::StrCat("spawn ", argv[0], ": ", std::strerror(rc));
    return result;
  }
  if (!stdin_data.empty()) {
    size_t off = 0;
    while (off < stdin_data.size()) {
      ssize_t n = write(in[1], stdin_data.data() + off, stdin_data.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
  close(in[1]);
  const absl::Time give_up = absl::Now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[8192];
  while (open_fds > 0 && absl::Now() < give_up) {
    int n = poll(fds, 2, 100);
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      ssize_t r = read(fds[i].fd, buf, sizeof(buf));
      if (r > 0) {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(r));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  if (open_fds > 0) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (open_fds > 0) result.err += "\n[harness: command timed out and was killed]";
  return result;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    if (done()) return true;
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string DispatchdBin() { return DISPATCHD_BIN; }
std::string DispatchctlBin() { return DISPATCHCTL_BIN; }
std::string WorkerBin() {
  const char* other = std::getenv("DISPATCHD_TEST_WORKER_BIN");
  return other != nullptr && *other != '\0' ? other : DISPATCH_WORKER_BIN;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/dispatchd-e2e.XXXXXX";
  char* p = mkdtemp(tmpl);
  if (p != nullptr) {
    path_ = p;
    chmod(p, 0755);
  }
}

TempDir::~TempDir() {
  if (path_.empty() || std::getenv("DISPATCHD_KEEP_TEST_DIRS") != nullptr) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options,
                                                      const TempDir& dir) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->dir_ = dir.path();
  d->config_path_ = dir.File("dispatchd.yaml");
  d->ready_path_ = dir.File("dispatchd.ready");
  std::string yaml =
      absl::StrCat("listen: 127.0.0.1:0\n", "state_dir: ", dir.File("state"), "\n",
                   "log_level: debug\n", "max_payload_bytes: ", options.max_payload_bytes, "\n",
                   "heartbeat_interval: ", options.heartbeat_interval, "\n",
                   "worker_stale_after: ", options.worker_stale_after, "\n",
                   "orphan_grace: ", options.orphan_grace, "\n", "metrics:\n",
                   "  listen: 127.0.0.1:0\n", "postgres:\n", "  url: \"", options.postgres_url,
                   "\"\n", "  connect_wait: 2s\n", options.postgres_yaml, "types:\n");
  for (const TypeSpec& t : options.types) {
    absl::StrAppend(&yaml, "  - name: ", t.name, "\n");
    if (t.max_concurrency > 0)
      absl::StrAppend(&yaml, "    max_concurrency: ", t.max_concurrency, "\n");
    if (t.max_attempts > 0) absl::StrAppend(&yaml, "    max_attempts: ", t.max_attempts, "\n");
    if (!t.timeout.empty()) absl::StrAppend(&yaml, "    timeout: ", t.timeout, "\n");
    if (!t.retry_backoff.empty())
      absl::StrAppend(&yaml, "    retry_backoff: ", t.retry_backoff, "\n");
    if (!t.on_orphan.empty()) absl::StrAppend(&yaml, "    on_orphan: ", t.on_orphan, "\n");
  }
  yaml += options.extra_yaml;
  std::ofstream(d->config_path_) << yaml;
  if (absl::Status s = d->Launch(); !s.ok()) return s;
  return d;
}

std::string Daemon::MetricsAddress() {
  const std::string kMarker = "metrics: serving http://";
  std::string address;
  WaitFor(
      [&] {
        const std::string log = process_->Log();
        // The latest start's line (a restarted daemon logs its own).
        const size_t at = log.rfind(kMarker);
        if (at == std::string::npos) return false;
        const size_t from = at + kMarker.size();
        address = log.substr(from, log.find("/metrics", from) - from);
        return true;
      },
      absl::Seconds(10));
  return address;
}

double Daemon::Metric(const std::string& series) {
  const std::string address = MetricsAddress();
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  httplib::Client client(address.substr(0, colon), port);
  httplib::Result r = client.Get("/metrics");
  if (!r || r->status != 200) return -1;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double v = 0;
      return absl::SimpleAtod(line, &v) ? v : -1;
    }
  }
  return -1;
}

absl::Status Daemon::Launch() {
  std::filesystem::remove(ready_path_);
  ++generation_;
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start({DispatchdBin(), "--config", config_path_, "--ready-file", ready_path_},
                     absl::StrCat(dir_, "/dispatchd.", generation_, ".log"));
  if (!p.ok()) return p.status();
  process_ = *std::move(p);
  bool ready =
      WaitFor([this] { return std::filesystem::exists(ready_path_) || !process_->Running(); },
              absl::Seconds(90));
  if (!ready || !std::filesystem::exists(ready_path_)) {
    return absl::UnavailableError(
        absl::StrCat("dispatchd did not become ready; log:\n", process_->Log()));
  }
  address_ = std::string(absl::StripAsciiWhitespace(ReadFile(ready_path_)));
  auto channel = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(),
                                           client::DaemonChannelArguments());
  jobs_ = v1::JobService::NewStub(channel);
  admin_ = v1::AdminService::NewStub(channel);
  return absl::OkStatus();
}

Daemon::~Daemon() {
  if (process_ && process_->Running()) Terminate().IgnoreError();
  // A daemon killed with -9 leaves its embedded PostgreSQL running: stop it.
  std::string data = dir_ + "/state/pg/data";
  if (std::filesystem::exists(data + "/postmaster.pid")) {
    std::vector<std::string> cmd = {
        "/usr/lib/postgresql/15/bin/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"};
    if (geteuid() == 0) cmd.insert(cmd.begin(), {"/usr/sbin/runuser", "-u", "postgres", "--"});
    RunCommand(cmd, absl::Seconds(30));
  }
}

void Daemon::Kill9() {
  process_->Signal(SIGKILL);
  process_->Wait(absl::Seconds(10)).IgnoreError();
}

absl::StatusOr<int> Daemon::Terminate() {
  process_->Signal(SIGTERM);
  return process_->Wait(absl::Seconds(30));
}

absl::Status Daemon::Restart() {
  if (process_->Running()) Kill9();
  // Keep the address, as a real deployment does, so that workers find the new process.
  std::string yaml = ReadFile(config_path_);
  if (size_t at = yaml.find("listen: 127.0.0.1:0\n"); at != std::string::npos) {
    yaml.replace(at, std::string("listen: 127.0.0.1:0\n").size(),
                 absl::StrCat("listen: ", address_, "\n"));
    std::ofstream(config_path_, std::ios::trunc) << yaml;
  }
  return Launch();
}

absl::StatusOr<std::string> Daemon::Submit(const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(absl::Seconds(10)));
  v1::SubmitRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitResponse resp;
  grpc::Status s = jobs_->Submit(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp.job_id();
}

absl::StatusOr<v1::Job> Daemon::Status(const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(absl::Seconds(10)));
  v1::StatusRequest req;
  req.set_job_id(job_id);
  v1::StatusResponse resp;
  grpc::Status s = jobs_->Status(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp.job();
}

absl::StatusOr<std::vector<v1::WorkerInfo>> Daemon::Workers() {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(absl::Seconds(10)));
  v1::ListWorkersResponse resp;
  grpc::Status s = admin_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return std::vector<v1::WorkerInfo>(resp.workers().begin(), resp.workers().end());
}

absl::StatusOr<v1::StatsResponse> Daemon::Stats() {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(absl::Seconds(10)));
  v1::StatsResponse resp;
  grpc::Status s = admin_->Stats(&ctx, v1::StatsRequest(), &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp;
}

absl::StatusOr<v1::TypeStats> Daemon::TypeStats(const std::string& type) {
  absl::StatusOr<v1::StatsResponse> stats = Stats();
  if (!stats.ok()) return stats.status();
  for (const v1::TypeStats& t : stats->types()) {
    if (t.type() == type) return t;
  }
  return absl::NotFoundError(absl::StrCat("Stats has no entry for type ", type));
}

bool Daemon::WaitForWorkers(int n, absl::Duration timeout) {
  return WaitFor(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> w = Workers();
        return w.ok() && static_cast<int>(w->size()) >= n;
      },
      timeout);
}

bool Daemon::WaitForTerminal(const std::vector<std::string>& ids, std::vector<v1::Job>* out,
                             absl::Duration timeout) {
  std::map<std::string, v1::Job> done;
  bool ok = WaitFor(
      [&] {
        for (const std::string& id : ids) {
          if (done.contains(id)) continue;
          absl::StatusOr<v1::Job> job = Status(id);
          if (!job.ok()) return false;
          v1::JobState s = job->state();
          if (s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
              s == v1::JOB_STATE_CANCELLED || s == v1::JOB_STATE_EXPIRED) {
            done[id] = *job;
          } else {
            return false;
          }
        }
        return true;
      },
      timeout);
  if (out != nullptr) {
    out->clear();
    for (const std::string& id : ids) {
      if (done.contains(id)) out->push_back(done[id]);
    }
  }
  return ok;
}

CommandResult Daemon::Ctl(std::vector<std::string> args, absl::Duration timeout) {
  args.insert(args.begin(), {DispatchctlBin(), "--server", address_});
  return RunCommand(args, timeout);
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const std::string& daemon_address,
                                                      const WorkerOptions& options,
                                                      const TempDir& dir) {
  auto w = std::unique_ptr<Worker>(new Worker());
  w->id_ = options.id;
  w->journal_ = dir.File(absl::StrCat("worker-", options.id, ".journal"));
  std::vector<std::string> argv = {WorkerBin(),
                                   "--server",
                                   daemon_address,
                                   "--id",
                                   options.id,
                                   "--types",
                                   absl::StrJoin(options.types, ","),
                                   "--slots",
                                   absl::StrCat(options.slots),
                                   "--journal",
                                   w->journal_};
  if (options.max_concurrent > 0) {
    argv.push_back("--max-concurrent");
    argv.push_back(absl::StrCat(options.max_concurrent));
  }
  argv.insert(argv.end(), options.mode.begin(), options.mode.end());
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start(argv, dir.File(absl::StrCat("worker-", options.id, ".log")));
  if (!p.ok()) return p.status();
  w->process_ = *std::move(p);
  return w;
}

std::vector<JournalEvent> ReadJournal(const std::string& path, const std::string& worker) {
  std::vector<JournalEvent> out;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.empty()) continue;
    JournalEvent e;
    e.worker = worker;
    e.start = parts[0] == "start";
    for (absl::string_view p : parts) {
      if (absl::ConsumePrefix(&p, "job=")) e.job_id = std::string(p);
      if (absl::ConsumePrefix(&p, "attempt=")) (void)absl::SimpleAtoi(p, &e.attempt);
      if (absl::ConsumePrefix(&p, "ok=")) e.ok = p == "1";
      if (absl::ConsumePrefix(&p, "ms=")) (void)absl::SimpleAtoi(p, &e.ms);
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<JournalEvent> Worker::Journal() const { return ReadJournal(journal_, id_); }

std::vector<JournalEvent> Journals(const std::vector<std::unique_ptr<Worker>>& workers) {
  std::vector<JournalEvent> out;
  for (const std::unique_ptr<Worker>& w : workers) {
    std::vector<JournalEvent> one = w->Journal();
    out.insert(out.end(), std::make_move_iterator(one.begin()), std::make_move_iterator(one.end()));
  }
  return out;
}

::testing::AssertionResult EachStartedOnce(const std::vector<JournalEvent>& events,
                                           const std::vector<std::string>& ids, OtherJobs others) {
  std::map<std::string, int> starts;
  for (const JournalEvent& e : events) {
    if (e.start) ++starts[e.job_id];
  }
  std::vector<std::string> wrong;
  for (const std::string& id : ids) {
    auto it = starts.find(id);
    const int n = it == starts.end() ? 0 : it->second;
    if (n != 1) wrong.push_back(absl::StrCat(id, " started ", n, " times"));
    if (it != starts.end()) starts.erase(it);
  }
  for (const auto& [id, n] : starts) {  // what is left started, but is not one of `ids`
    if (others == OtherJobs::kNone) {
      wrong.push_back(absl::StrCat(id, ", not one of the jobs, started ", n, " times"));
    }
  }
  if (wrong.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong.size() << " wrong, of " << ids.size() << " jobs: " << absl::StrJoin(wrong, "; ");
}

int MaxConcurrent(std::vector<JournalEvent> events) {
  // Ends sort before starts at the same millisecond: a slot freed and reused is not an overlap.
  std::sort(events.begin(), events.end(), [](const JournalEvent& a, const JournalEvent& b) {
    return a.ms != b.ms ? a.ms < b.ms : (!a.start && b.start);
  });
  int now = 0, best = 0;
  for (const JournalEvent& e : events) {
    now += e.start ? 1 : -1;
    best = std::max(best, now);
  }
  return best;
}

int MostRunning(const std::vector<v1::Job>& jobs) {
  auto micros = [](const google::protobuf::Timestamp& t) {
    return t.seconds() * 1000000 + t.nanos() / 1000;
  };
  // (time, +1 at a start or -1 at an end); an end sorts before a start at the same instant.
  std::vector<std::pair<int64_t, int>> edges;
  for (const v1::Job& j : jobs) {
    if (!j.has_started_at() || !j.has_finished_at()) continue;
    edges.emplace_back(micros(j.started_at()), 1);
    edges.emplace_back(micros(j.finished_at()), -1);
  }
  std::sort(edges.begin(), edges.end());
  int now = 0, best = 0;
  for (const auto& [at, delta] : edges) {
    now += delta;
    best = std::max(best, now);
  }
  return best;
}

v1::JobSpec Spec(const std::string& type, const std::string& payload) {
  v1::JobSpec spec;
  spec.set_type(type);
  spec.set_payload(payload);
  return spec;
}

void WriteTokensFile(const TempDir& dir, const std::vector<TokenEntry>& entries) {
  std::string text = "# test principals\n";
  for (const TokenEntry& e : entries) {
    const std::string token = absl::StrCat("tok-", e.name, "-", e.role, "-0123456789abcdef");
    std::ofstream(dir.File(e.name + ".token")) << token << "\n";
    const auth::TokenDigest d = auth::DigestOf(token);
    absl::StrAppend(&text, e.name, " ", e.role, " sha256:",
                    absl::BytesToHexString(
                        absl::string_view(reinterpret_cast<const char*>(d.data()), d.size())),
                    " ", e.options, "\n");
  }
  const std::string path = dir.File("tokens");
  const std::string next = path + ".next";
  std::ofstream(next) << text;
  chmod(next.c_str(), 0600);
  std::filesystem::rename(next, path);
}

std::string BearerOf(const TempDir& dir, const std::string& name) {
  return absl::StrCat("Bearer ", absl::StripAsciiWhitespace(ReadFile(dir.File(name + ".token"))));
}

}  // namespace dispatchd::e2e
