// dispatchd: the composition root. Reads the command line and the config, builds the concrete
// objects (embedded PostgreSQL if no URL is configured, the store, the dispatcher, the gRPC
// services) and wires them; there are no other globals.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include <signal.h>
#include <unistd.h>

#include "lib/config/live_config.h"
#include "lib/util/clock.h"
#include "server/auth/grpc_auth.h"
#include "server/config/yaml_config.h"
#include "server/console/console.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/job_events.h"
#include "server/embedded/embedded_postgres.h"
#include "server/ha/leadership.h"
#include "server/metrics/daemon_metrics.h"
#include "server/metrics/http_server.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/job_service.h"
#include "server/rpc/worker_service.h"
#include "server/store/group_inserter.h"
#include "server/store/pg_job_store.h"
#include "server/store/retention_keeper.h"
#include "server/util/executor.h"
#include "server/util/log.h"
#include "server/util/systemd.h"
#include "server/util/ticker.h"

#ifndef DISPATCHD_VERSION
#define DISPATCHD_VERSION "unknown"
#endif

namespace dispatchd {
namespace {

// Exit codes: 0 clean stop, 1 runtime failure (database, bind), 2 bad command line or config.
constexpr int kExitFailure = 1;
constexpr int kExitConfig = 2;
// How often the gRPC health status is brought up to date, and how long a dispatcher loop may go
// without coming round before the daemon reports NOT_SERVING.
constexpr absl::Duration kHealthPeriod = absl::Milliseconds(500);
constexpr absl::Duration kHealthStall = absl::Seconds(5);
// How often a stopping leader looks whether its workers' jobs have ended.
constexpr absl::Duration kStopPoll = absl::Milliseconds(20);

// The first step of a leader's stop: it assigns nothing more, tells its workers (Stopping), and
// waits up to `grace` for the jobs they run to end and for their outcomes to be written, so that
// they are recorded by this term rather than adopted by the next. A standby, or a leader with
// nothing on its workers, returns at once.
void FinishWorkersJobs(ha::Leadership& leadership, absl::Duration grace) {
  std::shared_ptr<dispatch::Dispatcher> d = leadership.dispatcher();
  if (d == nullptr || grace <= absl::ZeroDuration()) return;
  auto log = server::Log("main");
  if (!d->StopAssigning(absl::StrCat("the daemon is stopping: finish the jobs you run; it records "
                                     "their results for up to ",
                                     absl::FormatDuration(grace), ", then hands over"))) {
    return;
  }
  const absl::Time start = absl::Now();
  int64_t left = d->JobsInFlight();
  if (left > 0) {
    log->info("stopping: waiting up to {} for {} job(s) on workers", absl::FormatDuration(grace),
              left);
  }
  while (left > 0 && absl::Now() - start < grace && leadership.dispatcher() == d) {
    absl::SleepFor(kStopPoll);
    left = d->JobsInFlight();
  }
  if (left < 0) {
    log->warn("stopping: the dispatcher stopped while its workers' jobs were awaited");
  } else if (left > 0) {
    log->warn(
        "stopping: {} job(s) still on workers after {}: they stay with their workers, which "
        "report them to the next leader",
        left, absl::FormatDuration(absl::Now() - start));
  } else {
    log->info("stopping: no job on any worker after {}", absl::FormatDuration(absl::Now() - start));
  }
}

class RealClock final : public Clock {
 public:
  absl::Time TimeNow() override { return absl::Now(); }
};

// Writes `content` to `path` atomically (write a sibling, then rename).
bool WriteFileAtomically(const std::string& path, const std::string& content) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!(out << content)) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// An id for this daemon process, unique among daemons sharing a database: host, pid and a random
// suffix (a pid can repeat across hosts and restarts). Short enough for application_name.
std::string NewDaemonId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string h(host);
  if (h.size() > 32) h.resize(32);
  absl::BitGen rng;
  return absl::StrCat(h.empty() ? "dispatchd" : h, ":", getpid(), ":",
                      absl::Hex(absl::Uniform<uint32_t>(rng, 0, 0xffff), absl::kZeroPad4));
}

// Connects to PostgreSQL, retrying for `wait` so a daemon started beside its database comes up.
absl::StatusOr<std::unique_ptr<store::PgJobStore>> ConnectStore(const config::Config& config,
                                                                const std::string& url,
                                                                const std::string& daemon_id,
                                                                absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  while (true) {
    absl::StatusOr<std::unique_ptr<store::PgJobStore>> store = store::PgJobStore::Connect(
        store::PgStoreOptions{.url = url,
                              .pool_size = config.postgres.pool_size,
                              .application_name = ha::ApplicationName(daemon_id),
                              .idempotency_window = config.idempotency_window,
                              .retention = config.retention});
    if (store.ok() || store.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() >= give_up) {
      return store;
    }
    server::Log("main")->warn("database not reachable yet, retrying: {}", store.status().message());
    absl::SleepFor(absl::Seconds(1));
  }
}

// Fills the gauges of state from the leader's scheduler and workers on each scrape; a standby
// reports only that it does not lead.
void AddMetricsCollectors(const config::LiveConfig& live, const ha::Leadership& leadership) {
  metrics::DaemonMetrics& m = metrics::Metrics();
  m.registry.AddCollector([&live, &leadership, &m] {
    for (auto* family : {&m.queued, &m.queued_paged, &m.running, &m.rate_tokens, &m.rate_waiting,
                         &m.slots, &m.type_workers}) {
      family->Clear();
    }
    m.model_loads.Clear();
    std::shared_ptr<dispatch::Dispatcher> d = leadership.dispatcher();
    m.leader.With({}).Set(d != nullptr ? 1 : 0);
    if (d == nullptr) {
      m.workers.With({}).Set(0);
      return;
    }
    const dispatch::Dispatcher::Gauges gauges = d->ReadGauges();
    const sched::SchedulerStats& stats = gauges.scheduler;
    const std::shared_ptr<const config::Config> config = live.Get();
    // Every configured type has a count, 0 until the scheduler reports its serving workers.
    for (const config::JobTypeConfig& type : config->types) {
      m.type_workers.With({type.name}).Set(0);
    }
    for (const sched::SchedulerStats::Type& t : stats.types) {
      const config::JobTypeConfig* type = config->FindType(t.name);
      const metrics::Labels labels = {t.name, type != nullptr ? type->tier : "",
                                      type != nullptr ? type->model : ""};
      m.queued.With(labels).Set(static_cast<double>(t.queued));
      m.running.With(labels).Set(static_cast<double>(t.running));
      m.queued_paged.With({t.name}).Set(static_cast<double>(t.queued_outside));
      if (type != nullptr) m.type_workers.With({t.name}).Set(static_cast<double>(t.workers));
    }
    for (const sched::SchedulerStats::Model& model : stats.models) {
      if (model.tokens < 0) continue;  // no rate limit
      m.rate_tokens.With({model.name}).Set(model.tokens);
      m.rate_waiting.With({model.name}).Set(model.head == sched::WaitReason::kRateLimit ? 1 : 0);
    }
    for (const auto& [worker_id, loads] : gauges.model_loads) {
      m.model_loads.With({worker_id}).Inc(static_cast<double>(loads));
    }
    m.workers.With({}).Set(static_cast<double>(gauges.workers));
    m.slots.With({"busy"}).Set(static_cast<double>(gauges.busy));
    m.slots.With({"free"}).Set(
        static_cast<double>(std::max<int64_t>(gauges.slots - gauges.busy, 0)));
  });
}

// SIGHUP and AdminService.Reload: re-reads the config file and applies what can change while
// the daemon runs (see config::MergeReload); a file that does not load is refused and the
// running config stays. One reload at a time.
class Reloader {
 public:
  Reloader(std::string path, config::LiveConfig& live, sched::AdmissionGate& admission,
           ha::Leadership& leadership, auth::Gate& gate)
      : path_(std::move(path)),
        live_(live),
        admission_(admission),
        leadership_(leadership),
        gate_(gate) {}

  absl::StatusOr<v1::ReloadResponse> Reload(absl::string_view trigger) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("reload: the daemon is stopping");
    auto log = server::Log("main");
    log->info("{}: reloading {}", trigger, path_);
    server::NotifySystemd("RELOADING=1\nSTATUS=reloading the config");
    absl::StatusOr<config::Config> loaded = server::LoadConfigFile(path_);
    if (!loaded.ok()) {
      log->error("reload refused, the running config stays in force: {}",
                 loaded.status().message());
      metrics::Metrics().config_reloads.With({"refused"}).Inc();
      server::NotifySystemd("READY=1\nSTATUS=serving; the last reload was refused (see the log)");
      return absl::FailedPreconditionError(absl::StrCat(
          "reload refused, the running config stays in force: ", loaded.status().message()));
    }
    v1::ReloadResponse out;
    out.set_path(path_);
    std::vector<std::string> restart_only;
    config::Config merged = config::MergeReload(*live_.Get(), *loaded, &restart_only);
    // The principals come from the tokens file as well as the config: both load, or neither.
    std::shared_ptr<const auth::Identities> identities;
    if (gate_.enabled()) {
      absl::StatusOr<std::shared_ptr<const auth::Identities>> ids =
          auth::Identities::Load(merged.auth);
      if (!ids.ok()) {
        log->error("reload refused, the running config stays in force: {}", ids.status().message());
        metrics::Metrics().config_reloads.With({"refused"}).Inc();
        server::NotifySystemd("READY=1\nSTATUS=serving; the last reload was refused (see the log)");
        return absl::FailedPreconditionError(absl::StrCat(
            "reload refused, the running config stays in force: ", ids.status().message()));
      }
      identities = *std::move(ids);
    } else if (merged.auth.enabled()) {
      restart_only.push_back("auth");
      merged.auth = live_.Get()->auth;
    }
    for (const std::string& key : restart_only) {
      log->warn("reload: {} differs in the file; it keeps its running value until a restart", key);
      out.add_restart_only(key);
    }
    server::SetLogLevel(merged.log_level);
    admission_.UpdateConfig(merged);
    leadership_.UpdateConfig(merged);
    if (identities != nullptr) {
      log->info("reload: {} token(s) of {} principal(s), {} certificate name(s)",
                identities->tokens.size(), identities->tokens.principals(),
                identities->certificates.size());
      gate_.Set(std::move(identities));
    }
    out.set_types(static_cast<int32_t>(merged.types.size()));
    out.set_tiers(static_cast<int32_t>(merged.tiers.size()));
    live_.Set(std::move(merged));
    log->info("reloaded config types={} tiers={}", out.types(), out.tiers());
    metrics::Metrics().config_reloads.With({"applied"}).Inc();
    server::NotifySystemd("READY=1\nSTATUS=serving; config reloaded");
    return out;
  }

  // Refuses reloads from now on (a reload would tell systemd READY=1 again); waits for one
  // under way.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }

 private:
  const std::string path_;
  config::LiveConfig& live_;
  sched::AdmissionGate& admission_;
  ha::Leadership& leadership_;
  auth::Gate& gate_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

int Run(int argc, char** argv) {
  CLI::App app{"dispatchd: a job-dispatch daemon for GPU fleets"};
  std::string config_path = "/etc/dispatchd/dispatchd.yaml";
  std::string ready_file;
  bool show_version = false;
  app.add_option("-c,--config", config_path, "YAML config file")->capture_default_str();
  app.add_option("--ready-file", ready_file,
                 "once serving, write the bound gRPC address (host:port) to this file");
  app.add_flag("--version", show_version, "print the version and exit");
  app.footer(
      "Exit status: 0 after a clean stop (SIGTERM/SIGINT), 1 on a runtime failure such as an "
      "unreachable database, 2 on a bad command line or config file.\n"
      "Example: dispatchd --config config/dispatchd.yaml");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitConfig;
  }
  if (show_version) {
    std::printf("dispatchd %s\n", DISPATCHD_VERSION);
    return 0;
  }

  absl::StatusOr<config::Config> loaded = server::LoadConfigFile(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "dispatchd: config: %s\n", std::string(loaded.status().message()).c_str());
    return kExitConfig;
  }
  const config::Config config = *std::move(loaded);
  server::SetLogLevel(config.log_level);
  auto log = server::Log("main");
  log->info("starting version={} config={} listen={}", DISPATCHD_VERSION, config_path,
            config.listen);
  for (const config::JobTypeConfig& t : config.types) {
    log->info("job type name={} max_concurrency={} max_attempts={} timeout={}", t.name,
              t.max_concurrency == config::kUnlimited ? std::string("unlimited")
                                                      : std::to_string(t.max_concurrency),
              t.max_attempts, absl::FormatDuration(t.timeout));
  }

  // Who calls: resolved and checked once per call, at its method, by the gate.
  std::shared_ptr<const auth::Identities> identities;
  if (config.auth.enabled()) {
    absl::StatusOr<std::shared_ptr<const auth::Identities>> ids =
        auth::Identities::Load(config.auth);
    if (!ids.ok()) {
      log->error("{}", ids.status().message());
      return kExitConfig;
    }
    log->info("auth: {} token(s) of {} principal(s), {} certificate name(s)", (*ids)->tokens.size(),
              (*ids)->tokens.principals(), (*ids)->certificates.size());
    identities = *std::move(ids);
  }
  if (config.insecure) {
    log->warn("insecure: true: the daemon may serve {} without TLS or authentication",
              config.listen);
  }
  // Block the stop signals in every thread; this one waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<server::EmbeddedPostgres> embedded;
  std::string url = config.postgres.url;
  if (url.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.state_dir, ec);
    if (ec) {
      log->error("state_dir: cannot create {}: {}", config.state_dir, ec.message());
      return kExitFailure;
    }
    log->info("postgres.url is empty: starting the embedded PostgreSQL under {}/pg",
              config.state_dir);
    absl::StatusOr<std::unique_ptr<server::EmbeddedPostgres>> pg = server::EmbeddedPostgres::Start(
        server::EmbeddedPostgresOptions{.state_dir = config.state_dir,
                                        .bin_dir = config.postgres.bin_dir,
                                        .run_as_user = config.postgres.embedded_user});
    if (!pg.ok()) {
      log->error("{}", pg.status().message());
      return kExitFailure;
    }
    embedded = *std::move(pg);
    url = embedded->url();
  }

  const std::string daemon_id = NewDaemonId();
  absl::StatusOr<std::unique_ptr<store::PgJobStore>> store =
      ConnectStore(config, url, daemon_id, config.postgres.connect_wait);
  if (!store.ok()) {
    log->error("postgres.url: {}", store.status().message());
    return kExitFailure;
  }

  // Every daemon serves clients; the one that wins leader election also schedules (ha::Leadership
  // builds its dispatcher). The services are up before the election so that its address is known.
  // The config in force: SIGHUP replaces what can change while the daemon runs.
  config::LiveConfig live(config);
  RealClock clock;
  dispatch::JobEvents events;
  sched::AdmissionGate admission(config);
  server::Executor executor("store-reads", config.postgres.pool_size * 2);
  ha::Leadership leadership(config, ha::LeadershipOptions{.url = url, .daemon_id = daemon_id},
                            **store, clock, events, admission);
  store::GroupInserter inserter(**store, store::GroupInserter::Options{});
  store::RetentionKeeper retention(**store);
  auth::Gate gate(std::move(identities));
  sched::CallerLimits caller_limits;
  rpc::JobServiceImpl job_service(live, gate, caller_limits, **store, inserter, leadership, events,
                                  executor, clock);
  rpc::WorkerServiceImpl worker_service(live, gate, caller_limits, leadership);
  Reloader reloader(config_path, live, admission, leadership, gate);
  rpc::AdminServiceImpl admin_service(live, gate, **store, leadership, executor, [&reloader] {
    return reloader.Reload("AdminService.Reload");
  });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(config.listen, auth::ServerCredentials(config), &bound_port);
  // Room for the largest payload (clients) and, by default, for results up to the worker SDK's
  // 4 MiB limit. gRPC refuses a larger message RESOURCE_EXHAUSTED before reading it.
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.MaxMessageBytes()));
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  builder.RegisterService(&admin_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    log->error("listen: cannot bind {}", config.listen);
    return kExitFailure;
  }
  std::string host = config.listen.substr(0, config.listen.rfind(':'));
  std::string address = absl::StrCat(host, ":", bound_port);
  if (absl::Status s = leadership.Start(
          config.ha.advertise_address.empty() ? address : config.ha.advertise_address);
      !s.ok()) {
    log->error("leader election: {}", s.message());
    server->Shutdown(std::chrono::system_clock::now());
    return kExitFailure;
  }
  log->info("serving address={} daemon={} role={} tls={} auth={}", address, daemon_id,
            leadership.leader().is_leader ? "leader" : "standby",
            !config.tls.enabled()                                    ? "off"
            : config.tls.client_auth == config::ClientAuth::kRequire ? "mutual"
                                                                     : "on",
            gate.enabled() ? "on" : "off");
  std::unique_ptr<metrics::HttpServer> metrics_server;
  if (!config.metrics.listen.empty()) {
    AddMetricsCollectors(live, leadership);
    // The web console shares the port: its API calls this daemon's gRPC services in process,
    // with the caller's bearer token, so the gate and the roles are the gRPC API's.
    grpc::ChannelArguments console_args;
    console_args.SetMaxReceiveMessageSize(-1);  // a job's result, up to the daemon's own limit
    std::shared_ptr<grpc::Channel> console_channel = server->InProcessChannel(console_args);
    absl::StatusOr<std::unique_ptr<metrics::HttpServer>> started = metrics::HttpServer::Start(
        config.metrics.listen, metrics::Metrics().registry,
        [&console_channel](httplib::Server& http) { console::Mount(http, console_channel); });
    if (!started.ok()) {
      log->error("{}", started.status().message());
      leadership.Stop();
      server->Shutdown(std::chrono::system_clock::now());
      return kExitFailure;
    }
    metrics_server = *std::move(started);
    log->info("metrics: serving http://{}/metrics", metrics_server->address());
    log->info("console: serving http://{}/console/ auth={}{}", metrics_server->address(),
              gate.enabled() ? "on" : "off",
              gate.enabled() ? " (plain HTTP: bearer tokens cross it in clear)" : "");
  }
  if (!ready_file.empty() && !WriteFileAtomically(ready_file, address + "\n")) {
    log->error("--ready-file: cannot write {}", ready_file);
  }
  // The standard gRPC health service: SERVING for the daemon ("") and each of its services while
  // it reaches its database and, when it leads, its dispatcher loop turns.
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  auto publish_health = [&leadership, health, last = std::optional<bool>()]() mutable {
    std::string why;
    const bool serving = leadership.Serving(kHealthStall, &why);
    if (last == serving) return;
    for (const char* service :
         {"", v1::JobService::service_full_name(), v1::WorkerService::service_full_name(),
          v1::AdminService::service_full_name()}) {
      health->SetServingStatus(service, serving);
    }
    if (serving) {
      server::Log("main")->info("health: SERVING");
    } else {
      server::Log("main")->warn("health: NOT_SERVING: {}", why);
    }
    last = serving;
  };
  server::Ticker health_ticker(kHealthPeriod, std::move(publish_health));

  // Under systemd (Type=notify): ready now, and alive as long as its loops keep coming round.
  server::NotifySystemd(absl::StrCat("READY=1\nSTATUS=serving on ", address));
  const absl::Duration watchdog_period = server::SystemdWatchdogPeriod();
  server::Watchdog watchdog(watchdog_period, [&leadership, watchdog_period](std::string* why) {
    return leadership.MakingProgress(watchdog_period, why);
  });

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    (void)reloader.Reload("SIGHUP");
  }
  log->info("stopping signal={}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  reloader.Stop();
  server::NotifySystemd("STOPPING=1\nSTATUS=stopping");
  watchdog.Stop();
  health_ticker.Stop();
  health->Shutdown();  // NOT_SERVING from now on, so that probes stop sending work here
  // Admit nothing more: a client's Submit fails UNAVAILABLE, which it retries elsewhere.
  admission.Close(
      "stopping: this daemon is stopping; nothing was written: submit through another daemon of "
      "its database, or again once it is back");
  FinishWorkersJobs(leadership, live.Get()->stop_grace);
  if (metrics_server != nullptr) metrics_server->Stop();
  // Stop dispatching, end the worker streams and hand the lease to a standby, then let in-flight
  // calls end (and idle clients see the server go, up to 3 s). Jobs keep their rows; workers
  // reconnect to the next daemon and report what they still run.
  leadership.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  server->Wait();
  inserter.Stop();
  retention.Stop();
  log->info("stopped");
  return 0;
}

}  // namespace
}  // namespace dispatchd

namespace dispatchd {
namespace {

// protobuf logs an error for each string field that is not UTF-8 when it parses one; a client can
// send such requests at will, and each is answered INVALID_ARGUMENT already, so its lines go to
// the debug log. Fatal ones stay errors.
void RouteProtobufLogs(google::protobuf::LogLevel level, const char* file, int line,
                       const std::string& message) {
  auto log = server::Log("protobuf");
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    log->error("{}:{}: {}", file, line, message);
  } else {
    log->debug("{}:{}: {}", file, line, message);
  }
}

}  // namespace
}  // namespace dispatchd

int main(int argc, char** argv) {
  google::protobuf::SetLogHandler(&dispatchd::RouteProtobufLogs);
  // Abseil's lock-order graph costs a few percent of the daemon's CPU on every Mutex operation;
  // the tests, which link the same code without this main, keep it and catch cycles there.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return dispatchd::Run(argc, argv);
}
