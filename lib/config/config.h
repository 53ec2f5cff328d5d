#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "lib/auth/principal.h"

namespace dispatchd::config {

// What happens to a RUNNING job whose worker vanished or whose daemon restarted.
enum class OnOrphan { kRequeue, kFail };

inline constexpr int kUnlimited = std::numeric_limits<int>::max();

// A tier (`tiers[i]`): its value is both its priority (higher is dispatched first) and the most
// jobs of the tier that run at once, as in "background = 10: at most 10 background jobs run".
struct TierConfig {
  std::string name;
  int value = 0;
};

// Token bucket of a model (`types[i].rpm`/`rps` and `burst`). `per_second == 0`: no limit.
struct RateLimit {
  double per_second = 0;
  // Dispatches allowed at once after an idle spell: the bucket's capacity.
  int burst = 1;

  bool limited() const { return per_second > 0; }
  friend bool operator==(const RateLimit& a, const RateLimit& b) {
    return a.per_second == b.per_second && a.burst == b.burst;
  }
};

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
  // Tier by name (`tiers`); empty: the implicit lowest tier, priority 0 and no cap.
  std::string tier;
  // Jobs of one non-empty group on one resource_id never run at once (across types).
  std::string conflict_group;
  // Estimated cost in seconds of wall time, until the first observation of a (type, resource).
  double default_cost = 1.0;
  // GPU memory the model needs, in GB; negative: not set (counts as 0, with a warning at start).
  double vram_gb = -1;
  // Token bucket of the type's model (or of the type itself when it has no model).
  RateLimit rate;
  // Jobs of this type waiting in the queue at once; a Submit beyond it is refused.
  int max_queue_depth = kUnlimited;
  // How long a job may wait for a worker to leave another model before one is made to.
  absl::Duration max_affinity_wait = absl::Seconds(30);

  // The bucket and the model affinity key: `model`, or the type's name when it has none.
  const std::string& rate_key() const { return model.empty() ? name : model; }
};

// `memory_throttle:` in the YAML file: a worker whose RAM or GPU memory use (percent of total, from
// its heartbeats) passes a throttle threshold gets no new jobs until it drops below the lower
// resume threshold.
struct MemoryThrottleConfig {
  double ram_percent = 90;
  double ram_resume_percent = 80;
  double gpu_percent = 85;
  double gpu_resume_percent = 75;
};

// `overflow_hook:` in the YAML file: a command run when jobs wait for capacity, so that a fleet
// manager can add workers. Empty command: off.
struct OverflowHookConfig {
  std::string command;
  // At most one run per interval, however long the overflow lasts.
  absl::Duration interval = absl::Minutes(1);
  // A run still going after this is killed.
  absl::Duration timeout = absl::Seconds(30);
};

// `scheduler:` in the YAML file.
struct SchedulerConfig {
  // "fair": tiers, weighted fair queuing and model affinity. "fifo": arrival order only (caps,
  // conflicts, rate limits and VRAM still hold); a baseline for comparisons.
  std::string policy = "fair";
  // Weight of the newest observation in the cost estimate (exponential moving average).
  double cost_alpha = 0.3;
  // Idle fairness keys and cost estimates unused this long are forgotten.
  absl::Duration key_ttl = absl::Minutes(10);
  // Queued jobs of one queue (a job type and a fairness key) that the daemon holds in memory, at
  // most; the rest wait in the database and are read in, oldest first, as the queue drains.
  int64_t queue_window = 2048;
};

struct PostgresConfig {
  // libpq connection URL. Empty: run an embedded server under `state_dir`.
  std::string url;
  // Connections the daemon keeps open.
  int pool_size = 8;
  // Dispatcher turns (a batch of finishes, RUNNING marks and claims in one statement) whose
  // writes are in the database at once, each on a connection of the pool. 0: chosen by the
  // cores the daemon may use (TurnsInFlight, given server::UsableCores).
  int turns_in_flight = 0;

  // turns_in_flight, with 0 resolved for a machine of `cores` cores: 2 below 8 cores, where the
  // database shares them and a turn started beside others carries fewer rows for the same
  // commit, else 4, so that the commits overlap enough to keep spare cores busy; and at most
  // pool_size - 2 (at least 1), so that the calls' inserts and reads find a connection.
  int TurnsInFlight(unsigned cores) const {
    if (turns_in_flight > 0) return turns_in_flight;
    return std::max(1, std::min(cores >= 8 ? 4 : 2, pool_size - 2));
  }
  // OS user the embedded server runs as when the daemon runs as root.
  std::string embedded_user = "postgres";
  // Directory holding the PostgreSQL server binaries (initdb, pg_ctl, postgres).
  std::string bin_dir = "/usr/lib/postgresql/15/bin";
  // At start, how long to keep retrying an unreachable database before exiting.
  absl::Duration connect_wait = absl::Seconds(10);
};

// `ha:` in the YAML file. Several daemons may share one database: one leads (holds a PostgreSQL
// advisory lock and schedules), the others are standbys that serve clients and point workers at
// the leader. A single daemon simply always leads.
struct HaConfig {
  // How long a leader that stops renewing its lease (frozen, cut off) keeps it before a standby
  // removes it. A dead leader's lock is freed at once; a standby checks every `lease / 4`.
  absl::Duration lease = absl::Seconds(10);
  // The address workers and clients are told to use for this daemon when it leads. Empty: the
  // address it listens on (fine unless that is a wildcard or behind a proxy).
  std::string advertise_address;
};

// `metrics:` in the YAML file: the Prometheus endpoint.
struct MetricsConfig {
  // HTTP listen address of GET /metrics, host:port (port 0: any free port, logged at start).
  // Empty: no endpoint.
  std::string listen = "127.0.0.1:9464";
};

// `tls:` in the YAML file: TLS on the gRPC listener.
enum class ClientAuth {
  kNone,     // no client certificate is asked for
  kRequest,  // a client may present one; if it does, it must verify against client_ca_file
  kRequire,  // every connection must present a certificate that verifies
};
struct TlsConfig {
  // PEM files of the server's certificate chain and its private key; both or neither. With them
  // the gRPC listener speaks TLS only. The files are read again every `refresh_interval` and on
  // reload, so a certificate rotates without a restart: new connections get the new one, and
  // streams already open keep theirs.
  std::string cert_file;
  std::string key_file;
  // PEM file of the CA certificates that sign client certificates (mutual TLS).
  std::string client_ca_file;
  ClientAuth client_auth = ClientAuth::kNone;
  absl::Duration refresh_interval = absl::Minutes(1);

  bool enabled() const { return !cert_file.empty(); }
};

// One entry of `auth.certificates`: a verified client certificate whose common name or one of
// whose subject alternative names equals `name` is the principal `principal`.
struct CertificatePrincipal {
  std::string name;
  std::string principal;
  auth::Role role = auth::Role::kClient;
  // For a worker: the job types it may serve; empty: every type.
  std::vector<std::string> types;

  bool operator==(const CertificatePrincipal&) const = default;
};

// `auth:` in the YAML file: who the callers are. With neither a tokens file nor certificate
// principals, every caller is the unnamed local admin (auth::Principal::Local()).
struct AuthConfig {
  // File of hashed bearer tokens (see auth::TokenTable), read at start and on reload. It must
  // not be readable or writable by other users.
  std::string tokens_file;
  std::vector<CertificatePrincipal> certificates;

  bool enabled() const { return !tokens_file.empty() || !certificates.empty(); }
};

// `limits:` in the YAML file: bounds on what one request may carry and on what one principal
// may hold open or send. With no authentication every caller is the one local principal, so the
// per-principal limits then bound all callers together.
struct LimitsConfig {
  // Largest gRPC message the daemon accepts; 0: max(max_payload_bytes, 4 MiB) + 1 MiB. Larger
  // ones are refused RESOURCE_EXHAUSTED by gRPC before they are read.
  int64_t max_message_bytes = 0;
  // Labels per job, and the bytes of each label's key and of its value.
  int max_labels = 32;
  int max_label_bytes = 128;
  // Bytes of a spec's fairness_key, idempotency_key and resource_id.
  int max_key_bytes = 256;
  // Bytes of a job id in a request and of a worker's Hello worker_id.
  int max_id_bytes = 128;
  // Worker streams (Connect) one principal holds open at once.
  int worker_streams_per_principal = 1000;
  // Watch subscriptions one principal holds open at once.
  int watches_per_principal = 1000;
  // Jobs a principal may submit (Submit, SubmitBatch, RunSync), as a token bucket of
  // `submit_rate` jobs a second and `submit_burst` capacity; a rate of 0: no limit.
  RateLimit submit;

  bool operator==(const LimitsConfig&) const = default;
};

// A rate limit of one tenant on one model (or on a type with no model): `tenants[i].rates[j]`.
struct TenantRate {
  // A model, or a type that has no model: the key of the bucket this one sits beside.
  std::string model;
  RateLimit rate;

  bool operator==(const TenantRate&) const = default;
};

// A tenant (`tenants[i]`): principals that share one fair share of the fleet. Fairness holds
// between tenants first, by weight, then between the fairness keys inside a tenant. A principal
// no tenant names is a tenant of its own, of weight 1, named after it; with no authentication
// every job belongs to one tenant, the empty name.
struct TenantConfig {
  std::string name;
  std::vector<std::string> principals;
  // Share of the fleet against other tenants with work: a tenant of weight 3 is served three
  // times the cost of a tenant of weight 1 while both have work.
  double weight = 1;
  // Jobs of the tenant queued, dispatched or running at once; a Submit beyond it is refused
  // before anything is written, with a retry hint.
  int64_t max_active = std::numeric_limits<int64_t>::max();
  // Jobs of the tenant placed on workers at once.
  int max_running = kUnlimited;
  // Slots guaranteed while it has queued work: below it, the tenant is served before any tenant
  // at or above its own floor. Floor capacity it does not use is open to others.
  int min_running = 0;
  std::vector<TenantRate> rates;

  bool operator==(const TenantConfig&) const = default;
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
  // On SIGTERM, how long a leader waits for the jobs its workers run to finish (assigning none,
  // admitting none) before it hands its lease over and exits. 0: hand over at once.
  absl::Duration stop_grace = absl::Seconds(30);
  // Jobs queued, dispatched or running at once; a Submit beyond it is refused with a retry hint.
  int64_t max_active = 1'000'000;
  // How long after a job ends a repeat of its idempotency_key still returns it.
  absl::Duration idempotency_window = absl::Hours(24);
  // How long ended jobs are kept (readable with Status) before they are deleted.
  absl::Duration retention = absl::Hours(24 * 7);
  PostgresConfig postgres;
  SchedulerConfig scheduler;
  MemoryThrottleConfig memory_throttle;
  OverflowHookConfig overflow_hook;
  HaConfig ha;
  MetricsConfig metrics;
  TlsConfig tls;
  AuthConfig auth;
  LimitsConfig limits;
  // Serve a non-loopback `listen` without TLS and authentication, or `metrics.listen` (which has
  // no TLS) on a non-loopback address. Off: the daemon refuses to start that way.
  bool insecure = false;
  std::vector<TierConfig> tiers;
  std::vector<JobTypeConfig> types;
  std::vector<TenantConfig> tenants;

  // OK, or InvalidArgument naming the offending key, e.g. "types[2].max_concurrency: must be >= 1".
  absl::Status Validate() const;

  // The type named `name`, or nullptr.
  const JobTypeConfig* FindType(absl::string_view name) const;
  // The tier named `name`, or nullptr (also for the empty name: the implicit default tier).
  const TierConfig* FindTier(absl::string_view name) const;
  // The tenant that names `principal`, or nullptr (the principal is a tenant of its own).
  const TenantConfig* TenantOf(absl::string_view principal) const;
  // The tenant a job submitted by `principal` counts in: a configured tenant's name, or the
  // principal's own.
  std::string TenantNameOf(absl::string_view principal) const;

  // The gRPC message limit: limits.max_message_bytes, or what its 0 stands for.
  int64_t MaxMessageBytes() const;

  // Things worth a warning at start that are not errors, e.g. a model type with no vram_gb.
  std::vector<std::string> Warnings() const;
};

// True if `host_port` names a loopback address: 127.0.0.0/8, [::1] or localhost.
bool IsLoopbackAddress(absl::string_view host_port);

// What a reload may change while the daemon runs: `types`, `tiers`, `scheduler.policy`,
// `scheduler.cost_alpha`, `scheduler.key_ttl`, `max_active`, `tenants`, `log_level`, `limits` but
// for `limits.max_message_bytes`, and `auth` (the tokens file is read again even when its name is
// unchanged). The result is `running` with those taken from `loaded`; every other key keeps its
// running value, and the keys whose value differs in `loaded` are appended to `*restart_only` (e.g.
// "listen", "postgres.url") so that the caller can say they wait for a restart.
Config MergeReload(const Config& running, const Config& loaded,
                   std::vector<std::string>* restart_only);

}  // namespace dispatchd::config
