// dispatchctl: command-line client for dispatchd (JobService and AdminService).
//
//   dispatchctl submit --type echo --payload hello
//   dispatchctl --json status 0f3c...
//   dispatchctl stats
//   dispatchctl set-rate-limit llama-70b --rpm 30 --burst 5
//   dispatchctl health
//
// This file reads the command line and runs the command: the job commands are in
// dispatchctl_job_commands.cc, the operators' in dispatchctl_admin_commands.cc, and how they
// print in dispatchctl_render.cc. Exit codes are listed in kExitCodes (dispatchctl_exit.h), in
// --help, and in client/cpp/README.md.

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>

#include "client/cpp/dispatch_client.h"
#include "client/cpp/dispatchctl_admin_commands.h"
#include "client/cpp/dispatchctl_exit.h"
#include "client/cpp/dispatchctl_flags.h"
#include "client/cpp/dispatchctl_job_commands.h"
#include "client/cpp/security_flags.h"

namespace dispatchd::client::ctl {
namespace {

// A bash completion script for dispatchctl: `source <(dispatchctl completion bash)`.
constexpr char kBashCompletion[] = R"(# bash completion for dispatchctl
_dispatchctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local commands="submit run status cancel watch workers stats top drain reload health set-rate-limit set-weight completion"
  local globals="--server --json --timeout --tls-ca --tls-cert --tls-key --token-file --version --help"
  local i sub=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --server|--timeout|--tls-ca|--tls-cert|--tls-key|--token-file) ((i++)) ;;
      -*) ;;
      *) sub=${COMP_WORDS[i]}; break ;;
    esac
  done
  case $prev in
    --server|--timeout|--tls-ca|--tls-cert|--tls-key|--token-file|--payload|--type|--resource|--fairness-key|--idempotency-key|    --max-attempts|--job-timeout|--dispatch-deadline|--not-before|--label|--rpm|--rps|--burst|    --interval|--iterations) return 0 ;;
    --payload-file) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
  esac
  if [[ -z $sub ]]; then
    COMPREPLY=($(compgen -W "$commands $globals" -- "$cur"))
    return 0
  fi
  local flags="--help"
  case $sub in
    submit|run) flags="--type --payload --payload-file --resource --fairness-key --idempotency-key --max-attempts --job-timeout --dispatch-deadline --not-before --label --help" ;;
    set-rate-limit) flags="--rpm --rps --burst --clear --help" ;;
    top) flags="--interval --iterations --help" ;;
    completion) flags="bash" ;;
  esac
  COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _dispatchctl dispatchctl
)";

int Main(int argc, char** argv) {
  CLI::App app{"dispatchctl: command-line client for the dispatchd job-dispatch daemon."};
  app.require_subcommand(1);
  app.footer(kExitCodes);
  app.set_version_flag("--version", "dispatchctl " DISPATCHD_VERSION, "Print the version and exit");
  const char* env_server = std::getenv("DISPATCHD_SERVER");
  std::string server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:7411";
  bool json = false;
  std::string timeout_flag;
  app.add_option("--server", server,
                 "Daemon address host:port, or several numeric ones comma-separated (daemons "
                 "sharing a database) (env DISPATCHD_SERVER)")
      ->capture_default_str();
  Security security;
  AddSecurityFlags(app, &security);
  app.add_flag("--json", json, "Print JSON (one object per line for watch)");
  app.add_option("--timeout", timeout_flag,
                 "Per-RPC deadline (default 10s); for run and watch the wait limit (default 24h)");

  SpecFlags submit_flags, run_flags;
  CLI::App* submit = app.add_subcommand(
      "submit",
      "Queue a job and print its id.\n"
      "  Example: dispatchctl submit --type llm.embed --payload-file doc.txt --label gpu=h100");
  submit_flags.Register(submit);
  CLI::App* run =
      app.add_subcommand("run",
                         "Queue a job, wait for it, and print its result bytes to stdout.\n"
                         "  Example: dispatchctl --timeout 5m run --type echo --payload hello");
  run_flags.Register(run);

  std::string job_id;
  CLI::App* status = app.add_subcommand(
      "status",
      "Show one job; a queued one says why it waits and where it stands in line.\n"
      "  Example: dispatchctl --json status 0f3c9a1e");
  status->add_option("ID", job_id, "Job id")->required();
  CLI::App* cancel = app.add_subcommand(
      "cancel", "Cancel a queued or running job.\n  Example: dispatchctl cancel 0f3c9a1e");
  cancel->add_option("ID", job_id, "Job id")->required();
  CLI::App* watch = app.add_subcommand(
      "watch",
      "Print each state change of a job until it ends.\n  Example: dispatchctl watch 0f3c9a1e");
  watch->add_option("ID", job_id, "Job id")->required();
  CLI::App* workers = app.add_subcommand(
      "workers",
      "List connected workers: load, resident models, VRAM in use/total, model loads.\n"
      "  Example: dispatchctl workers");
  CLI::App* stats = app.add_subcommand(
      "stats",
      "Show queued and running jobs per tier, type, model and fairness key, token buckets,\n"
      "  and why the first job in line of each waits (WAITING-ON); then slot use.\n"
      "  Example: dispatchctl stats   (or dispatchctl --json stats)");
  std::string top_interval = "2s";
  int top_iterations = 0;
  CLI::App* top = app.add_subcommand(
      "top",
      "A refreshing view of queues, rates (done and failed per second), rate-limited models and\n"
      "  slots, until interrupted.\n"
      "  Example: dispatchctl top --interval 1s");
  top->add_option("--interval", top_interval, "Time between refreshes")->capture_default_str();
  top->add_option("--iterations", top_iterations, "Stop after this many refreshes (0: never)")
      ->capture_default_str();
  std::string completion_shell;
  CLI::App* completion =
      app.add_subcommand("completion",
                         "Print a shell completion script (bash).\n"
                         "  Example: source <(dispatchctl completion bash)   (or save it under\n"
                         "  /etc/bash_completion.d/dispatchctl)");
  completion->add_option("SHELL", completion_shell, "bash")
      ->required()
      ->check(CLI::IsMember({"bash"}));
  std::string drain_worker;
  CLI::App* drain = app.add_subcommand(
      "drain",
      "Drain a worker: it gets no new jobs, finishes those it runs, and (dispatch-worker) exits.\n"
      "  Example: dispatchctl drain gpu-host-3-gpu0   (ids as dispatchctl workers lists them)");
  drain->add_option("WORKER", drain_worker, "Worker id")->required();
  CLI::App* reload = app.add_subcommand(
      "reload",
      "Make the daemon re-read its config file, as SIGHUP does: types, tiers, rate limits and\n"
      "  caps change at once; a file that does not load is refused (exit 7) and the running\n"
      "  config stays. With several daemons, reload each.\n"
      "  Example: dispatchctl --server 10.0.0.5:7411 reload");
  std::string health_service;
  CLI::App* health = app.add_subcommand(
      "health",
      "Ask the daemon's standard gRPC health service whether it serves: SERVING while it reaches\n"
      "  its database and, if it leads, its dispatcher runs; exit 0 if so, 9 if NOT_SERVING.\n"
      "  Example: dispatchctl health   (or dispatchctl health dispatchd.v1.JobService)");
  health->add_option("SERVICE", health_service,
                     "A service, e.g. dispatchd.v1.JobService (default: the whole daemon)");
  RateLimitFlags rate_flags;
  CLI::App* set_rate_limit = app.add_subcommand(
      "set-rate-limit",
      "Change (--rpm or --rps, --burst) or remove (--clear) a model's rate limit until the\n"
      "  daemon's next config load.\n"
      "  Example: dispatchctl set-rate-limit llama-70b --rpm 30 --burst 5");
  set_rate_limit->add_option("MODEL", rate_flags.model, "Model (or a type without a model)")
      ->required();
  auto* rpm = set_rate_limit->add_option("--rpm", rate_flags.rpm, "Dispatches per minute");
  auto* rps = set_rate_limit->add_option("--rps", rate_flags.rps, "Dispatches per second");
  auto* burst = set_rate_limit->add_option(
      "--burst", rate_flags.burst, "Dispatches allowed at once after an idle spell (default 1)");
  auto* clear = set_rate_limit->add_flag("--clear", rate_flags.clear, "Remove the limit");
  rpm->excludes(rps);
  clear->excludes(rpm)->excludes(rps)->excludes(burst);
  std::string weight_tenant;
  double weight = 0;
  CLI::App* set_weight = app.add_subcommand(
      "set-weight",
      "Change a tenant's weight (its share against other tenants with work) until the daemon's\n"
      "  next config load.\n"
      "  Example: dispatchctl set-weight research 3");
  set_weight->add_option("TENANT", weight_tenant, "A tenant, or a principal no tenant names")
      ->required();
  set_weight->add_option("WEIGHT", weight, "0.001 to 1000000")->required();
  for (CLI::App* sub : {submit, run, status, cancel, watch, workers, stats, set_rate_limit,
                        set_weight, drain, reload, health, top, completion}) {
    sub->footer(kExitCodes);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }

  if (completion->parsed()) {
    std::cout << kBashCompletion;
    return kOk;
  }
  const bool waits = run->parsed() || watch->parsed();
  absl::Duration timeout = waits ? absl::Hours(24) : absl::Seconds(10);
  if (!timeout_flag.empty()) {
    absl::StatusOr<absl::Duration> d = ParseDurationFlag("--timeout", timeout_flag);
    if (!d.ok()) return Usage(d.status().message());
    timeout = *d;
  }
  ClientOptions options;
  options.default_deadline = waits ? absl::Seconds(10) : timeout;
  options.security = security;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server, options);
  if (!client.ok()) {
    const absl::string_view message = client.status().message();
    return Usage(absl::StartsWith(message, "--") ? std::string(message)
                                                 : absl::StrCat("--server: ", message));
  }

  if (submit->parsed()) return CmdSubmit(**client, submit_flags, json);
  if (run->parsed()) return CmdRun(**client, run_flags, json, timeout);
  if (status->parsed()) return CmdStatus(**client, job_id, json);
  if (cancel->parsed()) return CmdCancel(**client, job_id, json);
  if (watch->parsed()) return CmdWatch(**client, job_id, json, timeout);
  if (workers->parsed()) return CmdWorkers(**client, json);
  if (stats->parsed()) return CmdStats(**client, json);
  if (set_rate_limit->parsed()) return CmdSetRateLimit(**client, rate_flags, json);
  if (set_weight->parsed()) return CmdSetWeight(**client, weight_tenant, weight, json);
  if (drain->parsed()) return CmdDrain(**client, drain_worker, json);
  if (reload->parsed()) return CmdReload(**client, json);
  if (top->parsed()) {
    absl::StatusOr<absl::Duration> interval = ParseDurationFlag("--interval", top_interval);
    if (!interval.ok()) return Usage(interval.status().message());
    if (top_iterations < 0) return Usage("--iterations: must be >= 0");
    return CmdTop(**client, *interval, top_iterations);
  }
  if (health->parsed()) return CmdHealth(**client, health_service, json);
  return Usage("no command given");
}

}  // namespace
}  // namespace dispatchd::client::ctl

int main(int argc, char** argv) { return dispatchd::client::ctl::Main(argc, argv); }
