// dispatchctl: command-line client for dispatchd (JobService and AdminService).
//
//   dispatchctl submit --type echo --payload hello
//   dispatchctl --json status 0f3c...
//   dispatchctl stats
//   dispatchctl set-rate-limit llama-70b --rpm 30 --burst 5
//   dispatchctl health
//
// Exit codes are listed in kExitCodes (dispatchctl_exit.h), in --help, and in client/cpp/README.md.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include "client/cpp/dispatch_client.h"
#include "client/cpp/dispatchctl_exit.h"
#include "client/cpp/dispatchctl_render.h"
#include "client/cpp/security_flags.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client::ctl {
namespace {

// ---- Flag parsing ----------------------------------------------------------------------------

// A duration flag; INVALID_ARGUMENT naming the flag if it does not parse or is not positive.
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, const std::string& text) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration() ||
      d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": invalid duration \"", text, "\" (e.g. 30s, 1.5m, 2h)"));
  }
  return d;
}

// Flags shared by submit and run.
struct SpecFlags {
  std::string type;
  std::optional<std::string> payload;
  std::string payload_file;
  std::string resource, fairness_key, idempotency_key;
  int max_attempts = 0;
  std::string job_timeout, dispatch_deadline, not_before;
  std::vector<std::string> labels;

  void Register(CLI::App* cmd) {
    cmd->add_option("--type", type, "Job type (required)")->required();
    auto* p = cmd->add_option("--payload", payload, "Payload bytes, given inline");
    auto* f =
        cmd->add_option("--payload-file", payload_file, "Read the payload from a file, - = stdin");
    p->excludes(f);
    cmd->add_option("--resource", resource, "Resource id (conflict and cost unit)");
    cmd->add_option("--fairness-key", fairness_key, "Fairness key (default: the caller)");
    cmd->add_option("--idempotency-key", idempotency_key, "Deduplicate repeated submits");
    cmd->add_option("--max-attempts", max_attempts, "Attempt limit (0: the type's default)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--job-timeout", job_timeout, "Execution timeout per attempt, e.g. 30s");
    cmd->add_option("--dispatch-deadline", dispatch_deadline,
                    "How long the job may wait for capacity, e.g. 5m");
    cmd->add_option("--not-before", not_before, "Not dispatched before this RFC3339 time");
    cmd->add_option("--label", labels, "Placement constraint k=v (repeatable)");
  }

  absl::StatusOr<v1::JobSpec> Build() const {
    v1::JobSpec spec;
    spec.set_type(type);
    if (payload.has_value()) {
      spec.set_payload(*payload);
    } else if (!payload_file.empty()) {
      std::string data;
      if (payload_file == "-") {
        data.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      } else {
        std::ifstream in(payload_file, std::ios::binary);
        if (!in) {
          return absl::InvalidArgumentError(
              absl::StrCat("--payload-file: cannot read \"", payload_file, "\""));
        }
        data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      spec.set_payload(std::move(data));
    } else {
      return absl::InvalidArgumentError("--payload or --payload-file is required");
    }
    spec.set_resource_id(resource);
    spec.set_fairness_key(fairness_key);
    spec.set_idempotency_key(idempotency_key);
    spec.set_max_attempts(max_attempts);
    if (!job_timeout.empty()) {
      absl::StatusOr<absl::Duration> d = ParseDurationFlag("--job-timeout", job_timeout);
      if (!d.ok()) return d.status();
      *spec.mutable_timeout() = proto_convert::ToProto(*d);
    }
    if (!dispatch_deadline.empty()) {
      absl::StatusOr<absl::Duration> d =
          ParseDurationFlag("--dispatch-deadline", dispatch_deadline);
      if (!d.ok()) return d.status();
      *spec.mutable_dispatch_deadline() = proto_convert::ToProto(*d);
    }
    if (!not_before.empty()) {
      absl::Time t;
      std::string err;
      if (!absl::ParseTime(absl::RFC3339_full, not_before, &t, &err)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--not-before: invalid RFC3339 time \"", not_before, "\": ", err));
      }
      *spec.mutable_not_before() = proto_convert::ToProto(t);
    }
    for (const std::string& kv : labels) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--label: \"", kv, "\" is not k=v"));
      }
      (*spec.mutable_labels())[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    return spec;
  }
};

// ---- Commands --------------------------------------------------------------------------------

int CmdSubmit(Client& client, const SpecFlags& flags, bool json) {
  absl::StatusOr<v1::JobSpec> spec = flags.Build();
  if (!spec.ok()) return Usage(spec.status().message());
  absl::StatusOr<v1::SubmitResponse> r = client.Submit(*spec);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    std::cout << r->job_id() << (r->deduplicated() ? " (deduplicated)" : "") << "\n";
  }
  if (r->deduplicated()) {
    std::cerr << "dispatchctl: deduplicated: idempotency key \"" << spec->idempotency_key()
              << "\" matched job " << r->job_id() << "; nothing new was queued\n";
  }
  return kOk;
}

int CmdRun(Client& client, const SpecFlags& flags, bool json, absl::Duration wait) {
  absl::StatusOr<v1::JobSpec> spec = flags.Build();
  if (!spec.ok()) return Usage(spec.status().message());
  absl::StatusOr<v1::Job> job = client.RunSync(*spec, wait);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else if (job->state() == v1::JOB_STATE_SUCCEEDED) {
    PrintRunResult(*job);
  } else {
    std::cerr << "dispatchctl: job " << job->id() << " " << StateName(job->state())
              << (job->error().empty() ? "" : ": ") << job->error() << "\n";
  }
  return ExitForState(job->state());
}

int CmdStatus(Client& client, const std::string& id, bool json) {
  absl::StatusOr<v1::Job> job = client.Status(id);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    PrintJob(*job);
  }
  return ExitForState(job->state());
}

int CmdCancel(Client& client, const std::string& id, bool json) {
  absl::StatusOr<v1::Job> job = client.Cancel(id);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    std::cout << job->id() << " " << StateName(job->state()) << "\n";
  }
  if (job->state() == v1::JOB_STATE_CANCELLED) return kOk;
  return IsTerminal(job->state()) ? kFailedPrecondition : kJobActive;
}

int CmdWatch(Client& client, const std::string& id, bool json, absl::Duration wait) {
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  bool any = false;
  std::optional<ProgressLine> progress;
  if (!json && isatty(STDOUT_FILENO)) progress.emplace();
  absl::Status s = client.Watch(
      id,
      [&](const v1::Job& job) {
        any = true;
        last = job.state();
        if (json) {
          std::cout << ToJson(job) << std::endl;
          return;
        }
        // The time of the change as the daemon recorded it, else when it arrived here.
        absl::Time at =
            job.has_updated_at() ? proto_convert::FromProto(job.updated_at()) : absl::Now();
        const std::string line =
            absl::StrCat(FormatUtcTime(at), " ", StateName(job.state()), " attempt=", job.attempt(),
                         " worker=", job.worker_id().empty() ? "-" : job.worker_id());
        if (progress.has_value()) {
          progress->Event(line, StateName(job.state()), at);
        } else {
          std::cout << line << std::endl;
        }
      },
      wait);
  progress.reset();
  if (!s.ok()) return Fail(s);
  if (!any) return kJobActive;
  return ExitForState(last);
}

// A refreshing view of queues, workers and rates: every `interval`, the types (queued, running,
// and successes and failures per second since the last refresh), the rate-limited models and the
// slots. On a terminal each refresh replaces the last; otherwise they follow one another.
// `iterations` > 0 stops after that many.
int CmdTop(Client& client, absl::Duration interval, int iterations) {
  const bool tty = isatty(STDOUT_FILENO) != 0;
  std::map<std::string, std::pair<int64_t, int64_t>> last;  // type: succeeded, failed
  absl::Time last_at = absl::InfinitePast();
  for (int i = 0; iterations <= 0 || i < iterations; ++i) {
    if (i > 0) absl::SleepFor(interval);
    absl::StatusOr<v1::StatsResponse> r = client.Stats();
    if (!r.ok()) return Fail(r.status());
    const absl::Time now = absl::Now();
    const double seconds = absl::ToDoubleSeconds(now - last_at);
    std::ostringstream page;
    if (tty) page << "\033[H\033[2J";
    const v1::LeaderInfo& leader = r->leader();
    page << "dispatchd " << (leader.address().empty() ? "(no leader)" : leader.address())
         << "  workers " << r->workers() << "  slots " << r->slots_busy() << "/" << r->slots_total()
         << " busy  " << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()) << "\n\n";
    std::cout << page.str();
    std::vector<std::vector<std::string>> rows = {
        {"TYPE", "QUEUED", "RUNNING", "DONE/S", "FAILED/S", "WAITING-ON"}};
    for (const v1::TypeStats& t : r->types()) {
      std::string done = "-", failed = "-";
      if (auto it = last.find(t.type()); it != last.end() && seconds > 0) {
        done = FormatNumber(static_cast<double>(t.succeeded() - it->second.first) / seconds, 1);
        failed = FormatNumber(static_cast<double>(t.failed() - it->second.second) / seconds, 1);
      }
      last[t.type()] = {t.succeeded(), t.failed()};
      rows.push_back({t.type(), absl::StrCat(t.queued()),
                      absl::StrCat(t.dispatched() + t.running()), done, failed,
                      WaitCell(t.head_wait_reason(), t.queued())});
    }
    PrintTable(rows);
    std::vector<std::vector<std::string>> models = {
        {"MODEL", "QUEUED", "RUNNING", "TOKENS", "RATE", "WAITING-ON"}};
    for (const v1::ModelStats& m : r->models()) {
      if (m.tokens() < 0) continue;  // only the rate-limited ones
      models.push_back({m.model(), absl::StrCat(m.queued()), absl::StrCat(m.running()),
                        FormatNumber(m.tokens()), FormatRate(m.rate_per_second()),
                        WaitCell(m.head_wait_reason(), m.queued())});
    }
    if (models.size() > 1) {
      std::cout << "\n";
      PrintTable(models);
    }
    if (!tty) std::cout << "\n";
    std::cout << std::flush;
    last_at = now;
  }
  return kOk;
}

// A bash completion script for dispatchctl: `source <(dispatchctl completion bash)`.
constexpr char kBashCompletion[] = R"(# bash completion for dispatchctl
_dispatchctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local commands="submit run status cancel watch workers stats top drain reload health set-rate-limit set-weight completion"
  local globals="--server --json --timeout --tls-ca --tls-cert --tls-key --token-file --help"
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

int CmdDrain(Client& client, const std::string& worker_id, bool json) {
  absl::StatusOr<v1::DrainWorkerResponse> r = client.DrainWorker(worker_id);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    const v1::WorkerInfo& w = r->worker();
    std::cout << w.worker_id() << ": draining; " << w.busy()
              << (w.busy() == 1 ? " job finishes" : " jobs finish")
              << " first, and no new job goes to it\n";
  }
  return kOk;
}

int CmdReload(Client& client, bool json) {
  absl::StatusOr<v1::ReloadResponse> r = client.Reload();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  std::cout << "reloaded " << r->path() << ": " << r->types()
            << (r->types() == 1 ? " type" : " types") << ", " << r->tiers()
            << (r->tiers() == 1 ? " tier" : " tiers") << "\n";
  for (const std::string& key : r->restart_only()) {
    std::cout << "  " << key
              << " differs in the file; it keeps its running value until a restart\n";
  }
  return kOk;
}

int CmdHealth(Client& client, const std::string& service, bool json) {
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> r = client.Health(service);
  if (!r.ok()) return Fail(r.status());
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*r);
  if (json) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(*r);
    std::cout << ToJson(response) << "\n";
  } else {
    std::cout << name << "\n";
  }
  return *r == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kNotServing;
}

int CmdWorkers(Client& client, bool json) {
  absl::StatusOr<v1::ListWorkersResponse> r = client.ListWorkers();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  PrintWorkers(*r);
  return kOk;
}

int CmdStats(Client& client, bool json) {
  absl::StatusOr<v1::StatsResponse> r = client.Stats();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  PrintStats(*r);
  return kOk;
}

// Flags of set-rate-limit.
struct RateLimitFlags {
  std::string model;
  std::optional<double> rpm, rps;
  std::optional<int> burst;
  bool clear = false;
};

int CmdSetRateLimit(Client& client, const RateLimitFlags& flags, bool json) {
  v1::SetRateLimitRequest req;
  req.set_model(flags.model);
  if (!flags.clear) {
    if (!flags.rpm.has_value() && !flags.rps.has_value()) {
      return Usage("set-rate-limit: give --rpm N or --rps N (or --clear to remove the limit)");
    }
    // 0 on the wire means "unset" (and both unset clears the limit): refuse it here.
    for (const auto& [flag, value] :
         {std::pair{"--rpm", flags.rpm}, std::pair{"--rps", flags.rps}}) {
      if (value.has_value() && !(*value > 0)) {
        return Usage(absl::StrCat(flag, ": must be > 0, got ", FormatNumber(*value, 6)));
      }
    }
    if (flags.rpm.has_value()) req.set_rpm(*flags.rpm);
    if (flags.rps.has_value()) req.set_rps(*flags.rps);
    if (flags.burst.has_value()) req.set_burst(*flags.burst);
  }
  absl::StatusOr<v1::SetRateLimitResponse> r = client.SetRateLimit(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else if (r->rate_per_second() <= 0) {
    std::cout << r->model() << ": no rate limit (until the daemon's next config load)\n";
  } else {
    std::cout << r->model() << ": rate " << FormatRate(r->rate_per_second()) << ", burst "
              << r->burst() << " (until the daemon's next config load)\n";
  }
  return kOk;
}

int CmdSetWeight(Client& client, const std::string& tenant, double weight, bool json) {
  v1::SetTenantWeightRequest req;
  req.set_tenant(tenant);
  req.set_weight(weight);
  absl::StatusOr<v1::SetTenantWeightResponse> r = client.SetTenantWeight(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    std::cout << r->tenant() << ": weight " << FormatNumber(r->weight(), 6)
              << " (until the daemon's next config load)\n";
  }
  return kOk;
}

int Main(int argc, char** argv) {
  CLI::App app{"dispatchctl: command-line client for the dispatchd job-dispatch daemon."};
  app.require_subcommand(1);
  app.footer(kExitCodes);
  const char* env_server = std::getenv("DISPATCHD_SERVER");
  std::string server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:7411";
  bool json = false;
  std::string timeout_flag;
  app.add_option("--server", server, "Daemon address host:port, or several numeric ones comma-separated (daemons sharing a database) (env DISPATCHD_SERVER)")
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
  CLI::App* completion = app.add_subcommand(
      "completion",
      "Print a shell completion script (bash).\n"
      "  Example: source <(dispatchctl completion bash)   (or save it under\n"
      "  /etc/bash_completion.d/dispatchctl)");
  completion->add_option("SHELL", completion_shell, "bash")->required()->check(
      CLI::IsMember({"bash"}));
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
