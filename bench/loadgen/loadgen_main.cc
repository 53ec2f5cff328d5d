// dispatch-loadgen: drives a daemon's JobService for the client scenarios of bench/bench.py.
//
//   dispatch-loadgen --server 127.0.0.1:7411 flood --jobs 100000 --clients 8 --inflight 64
//   dispatch-loadgen --server 127.0.0.1:7411 probe --rpc runsync --count 1000 --rate 100
//   dispatch-loadgen --tls-ca ca.pem --token-file client.token ... flood ...
//
// --tls-ca, --tls-cert, --tls-key and --token-file are every tool's (client/cpp/security_flags.h):
// every channel and call of the run carries them. --wait-workers lists the workers, an
// AdminService call, which a daemon with authentication on allows an admin only.
//
// Prints one JSON line on stdout (the summary; see --help) and, with --record, one line per job.
// Exit status: 0 when every job was acknowledged; 1 on any error other than RESOURCE_EXHAUSTED
// (which is retried after the daemon's hint, and counted), or when the daemon cannot be reached;
// 2 on a usage error.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>

#include "bench/loadgen/load_driver.h"
#include "bench/tool_main.h"
#include "client/cpp/credentials.h"
#include "client/cpp/security_flags.h"

namespace dispatchd::bench {
namespace {

int UsageError(const std::string& message) {
  return bench::UsageError("dispatch-loadgen", message);
}

// The summary line. Every key is documented in --help.
std::string SummaryJson(const std::string& mode, const std::string& rpc, int64_t requested,
                        const std::string& shape, const RunSummary& run) {
  const double seconds = static_cast<double>(run.end_us - run.start_us) / 1e6;
  auto per_second = [&](int64_t n) { return seconds > 0 ? static_cast<double>(n) / seconds : 0.0; };
  const LatencySummary& l = run.call_latency;
  return absl::StrFormat(
      "{\"mode\":\"%s\",\"rpc\":\"%s\",%s,\"requested\":%d,\"jobs\":%d,\"calls\":%d,"
      "\"resource_exhausted\":%d,\"errors\":%d,\"late\":%d,\"start_us\":%d,\"end_us\":%d,"
      "\"seconds\":%.6f,\"jobs_per_s\":%.1f,\"calls_per_s\":%.1f,\"latency_us\":{\"count\":%d,"
      "\"p50\":%d,\"p90\":%d,\"p99\":%d,\"p999\":%d,\"max\":%d,\"mean\":%.1f},\"cpu_s\":%.3f}",
      mode, rpc, shape, requested, run.jobs, run.calls, run.resource_exhausted, run.errors,
      run.late, run.start_us, run.end_us, seconds, per_second(run.jobs), per_second(run.calls),
      l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us, l.mean_us, CpuSeconds());
}

absl::Status WriteRecords(const std::string& path, const RunSummary& run) {
  std::ofstream out(path, std::ios::trunc);
  for (const JobRecord& r : run.records) {
    out << r.seq << ' ' << r.job_id << ' ' << r.sent_us << ' ' << r.answered_us << '\n';
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("--record: cannot write \"", path, "\""));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // Debian's abseil tracks the lock order of every Mutex (gRPC's included) unless told not to: a
  // cost on every call that a load generator has no use for.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{
      "dispatch-loadgen: load and latency probes against a dispatchd JobService (bench/bench.py's "
      "e2e and latency scenarios)."};
  app.require_subcommand(1);
  app.fallthrough();
  const char* env_server = std::getenv("DISPATCHD_SERVER");
  std::string server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:7411";
  JobTemplate job;
  std::string call_timeout_flag = "60s", wait_timeout_flag = "60s", record_path;
  int wait_workers = 0;
  app.add_option("--server", server, "Daemon address host:port (env DISPATCHD_SERVER)")
      ->capture_default_str();
  app.add_option("--type", job.type, "Job type of every job")->capture_default_str();
  app.add_option("--payload", job.payload, "Payload of every job")->capture_default_str();
  app.add_option("--call-timeout", call_timeout_flag,
                 "Deadline of each call (RunSync: the wait for the job)")
      ->capture_default_str();
  app.add_option("--wait-workers", wait_workers,
                 "Before starting the clock, wait until the daemon lists this many workers")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--wait-timeout", wait_timeout_flag, "How long --wait-workers may wait")
      ->capture_default_str();
  app.add_option("--record", record_path,
                 "Write `SEQ JOB_ID SENT_US ANSWERED_US` per job acknowledged: SEQ is the send "
                 "order of its call (probes below --warmup are warm-up), times are the system "
                 "clock in microseconds since the epoch, of the call's (last) send and its answer");
  client::Security security;
  client::AddSecurityFlags(app, &security);

  FloodOptions flood;
  CLI::App* flood_cmd = app.add_subcommand(
      "flood",
      "Queue --jobs jobs as fast as they are admitted: --clients channels, each with "
      "--inflight calls in flight (Submit, or SubmitBatch of --batch specs)");
  flood_cmd->add_option("--jobs", flood.jobs, "Jobs to queue in all")->required();
  flood_cmd->add_option("--clients", flood.clients, "Channels (one connection each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  flood_cmd->add_option("--inflight", flood.inflight, "Calls in flight per client")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  flood_cmd->add_option("--batch", flood.batch, "Specs per call; above 1, SubmitBatch")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  flood_cmd->add_option("--threads", flood.threads, "Completion-queue threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  ProbeOptions probe;
  std::string rpc_flag = "submit";
  CLI::App* probe_cmd = app.add_subcommand(
      "probe",
      "Send --count Submit or RunSync calls at --rate per second, at most --inflight "
      "at once, and time each from send to answer");
  probe_cmd->add_option("--rpc", rpc_flag, "submit | runsync")
      ->capture_default_str()
      ->check(CLI::IsMember({"submit", "runsync"}));
  probe_cmd->add_option("--count", probe.count, "Probes to send, warm-up included")->required();
  probe_cmd->add_option("--warmup", probe.warmup, "First probes left out of the latencies")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  probe_cmd->add_option("--rate", probe.rate, "Probes per second")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  probe_cmd->add_option("--inflight", probe.inflight, "Probes in flight at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  app.footer(
      "Output: one JSON line on stdout: mode, rpc, the shape (clients, inflight, batch, threads "
      "or rate, inflight, warmup), requested, jobs (acknowledged), calls (answered OK), "
      "resource_exhausted (refusals, each resent after its retry-after-ms), errors (any other "
      "failure: no new call starts after one), late (probes sent after their time because "
      "--inflight were out), start_us/end_us (first send, last answer; system clock), seconds, "
      "jobs_per_s, calls_per_s, latency_us {count, p50, p90, p99, p999, max, mean} of each OK "
      "call from its last send to its answer (probes: warm-up excluded), cpu_s (this process).\n"
      "Exit status: 0 when every job was acknowledged, 1 otherwise, 2 on a usage error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  absl::Duration call_timeout, wait_timeout;
  if (!absl::ParseDuration(call_timeout_flag, &call_timeout) ||
      call_timeout <= absl::ZeroDuration()) {
    return UsageError(absl::StrCat("--call-timeout: invalid duration \"", call_timeout_flag, "\""));
  }
  if (!absl::ParseDuration(wait_timeout_flag, &wait_timeout) ||
      wait_timeout <= absl::ZeroDuration()) {
    return UsageError(absl::StrCat("--wait-timeout: invalid duration \"", wait_timeout_flag, "\""));
  }

  absl::StatusOr<client::Credentials> credentials = client::LoadCredentials(security);
  if (!credentials.ok()) return UsageError(std::string(credentials.status().message()));

  if (absl::Status s = WaitForDaemon(server, *credentials, wait_workers, wait_timeout); !s.ok()) {
    std::fprintf(stderr, "dispatch-loadgen: %s\n", s.ToString().c_str());
    return 1;
  }

  absl::StatusOr<RunSummary> run;
  std::string mode, rpc, shape;
  int64_t requested = 0;
  if (flood_cmd->parsed()) {
    flood.server = server;
    flood.credentials = *credentials;
    flood.job = job;
    flood.call_timeout = call_timeout;
    flood.keep_records = !record_path.empty();
    mode = "flood";
    rpc = flood.batch > 1 ? "SubmitBatch" : "Submit";
    shape = absl::StrFormat("\"clients\":%d,\"inflight\":%d,\"batch\":%d,\"threads\":%d",
                            flood.clients, flood.inflight, flood.batch, flood.threads);
    requested = flood.jobs;
    run = RunFlood(flood);
  } else {
    probe.server = server;
    probe.credentials = *credentials;
    probe.job = job;
    probe.kind = rpc_flag == "runsync" ? ProbeKind::kRunSync : ProbeKind::kSubmit;
    probe.call_timeout = call_timeout;
    probe.keep_records = !record_path.empty();
    mode = "probe";
    rpc = probe.kind == ProbeKind::kRunSync ? "RunSync" : "Submit";
    shape = absl::StrFormat("\"rate\":%.3f,\"inflight\":%d,\"warmup\":%d", probe.rate,
                            probe.inflight, probe.warmup);
    requested = probe.count;
    run = RunProbes(probe);
  }
  if (!run.ok()) {
    if (absl::IsInvalidArgument(run.status())) {
      return UsageError(std::string(run.status().message()));
    }
    std::fprintf(stderr, "dispatch-loadgen: %s\n", run.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", SummaryJson(mode, rpc, requested, shape, *run).c_str());
  std::fflush(stdout);
  for (const std::string& m : run->error_messages) {
    std::fprintf(stderr, "dispatch-loadgen: error: %s\n", m.c_str());
  }
  if (!record_path.empty()) {
    if (absl::Status s = WriteRecords(record_path, *run); !s.ok()) {
      std::fprintf(stderr, "dispatch-loadgen: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  if (run->errors > 0 || run->jobs != requested) {
    std::fprintf(stderr, "dispatch-loadgen: FAILED: %lld of %lld jobs acknowledged, %lld errors\n",
                 static_cast<long long>(run->jobs), static_cast<long long>(requested),
                 static_cast<long long>(run->errors));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dispatchd::bench

int main(int argc, char** argv) { return dispatchd::bench::Main(argc, argv); }
