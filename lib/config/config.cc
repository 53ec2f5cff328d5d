#include "lib/config/config.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace dispatchd::config {
namespace {

absl::Status Bad(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", why));
}

bool ValidListen(absl::string_view addr) {
  size_t colon = addr.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int port = 0;
  return absl::SimpleAtoi(addr.substr(colon + 1), &port) && port >= 0 && port <= 65535;
}

bool ValidTypeName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status ValidateSecurity(const Config& c) {
  const TlsConfig& tls = c.tls;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Bad(tls.cert_file.empty() ? "tls.cert_file" : "tls.key_file",
               "tls.cert_file and tls.key_file go together");
  }
  if (!tls.enabled() && (!tls.client_ca_file.empty() || tls.client_auth != ClientAuth::kNone)) {
    return Bad("tls.cert_file", "mutual TLS (tls.client_ca_file, tls.client_auth) needs it");
  }
  if (tls.client_auth != ClientAuth::kNone && tls.client_ca_file.empty()) {
    return Bad("tls.client_ca_file", "required when tls.client_auth is request or require");
  }
  if (tls.refresh_interval < absl::Seconds(1)) {
    return Bad("tls.refresh_interval", "must be at least 1s");
  }
  absl::flat_hash_set<absl::string_view> names;
  for (size_t i = 0; i < c.auth.certificates.size(); ++i) {
    const CertificatePrincipal& cert = c.auth.certificates[i];
    const std::string key = absl::StrCat("auth.certificates[", i, "]");
    if (cert.name.empty()) return Bad(absl::StrCat(key, ".name"), "must not be empty");
    if (!names.insert(cert.name).second) {
      return Bad(absl::StrCat(key, ".name"), absl::StrCat("duplicate name \"", cert.name, "\""));
    }
    if (cert.principal.empty()) return Bad(absl::StrCat(key, ".principal"), "must not be empty");
    if (!cert.types.empty() && cert.role != auth::Role::kWorker) {
      return Bad(absl::StrCat(key, ".types"), "only a worker may be limited to types");
    }
  }
  if (!c.auth.certificates.empty() && tls.client_auth == ClientAuth::kNone) {
    return Bad("auth.certificates", "needs tls.client_auth request or require");
  }
  if (c.auth.enabled() && !tls.enabled() && !IsLoopbackAddress(c.listen)) {
    // Tokens would cross the network in clear, and gRPC's local credentials, which carry them
    // on loopback, admit loopback peers only.
    return Bad("auth", absl::StrCat("without tls.cert_file, authentication works on a loopback "
                                    "listen address only, not \"",
                                    c.listen, "\""));
  }
  if (c.insecure) return absl::OkStatus();
  // With neither TLS nor a way to tell callers apart, anyone who can reach the port is an admin:
  // only the machine itself may reach it, unless the operator says so in so many words.
  const bool identified = c.auth.enabled();
  if (!IsLoopbackAddress(c.listen) && !(tls.enabled() && identified)) {
    return Bad("listen",
               absl::StrCat("\"", c.listen,
                            "\" is not a loopback address: serving it needs tls.cert_file "
                            "and auth (auth.tokens_file or auth.certificates), or "
                            "insecure: true to serve it without them"));
  }
  if (!c.metrics.listen.empty() && !IsLoopbackAddress(c.metrics.listen)) {
    return Bad("metrics.listen",
               absl::StrCat("\"", c.metrics.listen,
                            "\" is not a loopback address and the metrics endpoint has no TLS: "
                            "keep it on loopback (behind a proxy that adds TLS), or set "
                            "insecure: true"));
  }
  return absl::OkStatus();
}

absl::Status InRange(const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
}

absl::Status ValidateLimits(const LimitsConfig& l, int64_t max_payload_bytes) {
  // A message must hold a largest payload and the rest of its spec.
  const int64_t least_message = max_payload_bytes + 64 * 1024;
  if (l.max_message_bytes != 0 &&
      (l.max_message_bytes < least_message || l.max_message_bytes > (int64_t{1} << 30))) {
    return Bad("limits.max_message_bytes",
               absl::StrCat("must be 0 (automatic) or in [max_payload_bytes + 65536 = ",
                            least_message, ", 1073741824], got ", l.max_message_bytes));
  }
  if (absl::Status s = InRange("limits.max_labels", l.max_labels, 0, 1000); !s.ok()) return s;
  if (absl::Status s = InRange("limits.max_label_bytes", l.max_label_bytes, 1, 4096); !s.ok()) {
    return s;
  }
  if (absl::Status s = InRange("limits.max_key_bytes", l.max_key_bytes, 1, 4096); !s.ok()) {
    return s;
  }
  // Ids the daemon makes are 30 bytes; a limit below that would refuse its own ids.
  if (absl::Status s = InRange("limits.max_id_bytes", l.max_id_bytes, 32, 4096); !s.ok()) {
    return s;
  }
  if (absl::Status s = InRange("limits.worker_streams_per_principal",
                               l.worker_streams_per_principal, 1, 1'000'000);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          InRange("limits.watches_per_principal", l.watches_per_principal, 1, 1'000'000);
      !s.ok()) {
    return s;
  }
  if (!(l.submit.per_second >= 0 && l.submit.per_second <= 1e9)) {
    return Bad("limits.submit_rate",
               absl::StrCat("must be in [0, 1e9] jobs a second, got ", l.submit.per_second));
  }
  return InRange("limits.submit_burst", l.submit.burst, 1, 1'000'000'000);
}

// Tenants: unique names, each principal in one tenant at most, floors under ceilings, and rates
// on models (or model-less types) that exist. Runs after the types are checked.
absl::Status ValidateTenants(const Config& c) {
  absl::flat_hash_set<absl::string_view> names;
  absl::flat_hash_map<absl::string_view, size_t> principal_of;
  absl::flat_hash_set<std::string> rate_keys;
  for (const JobTypeConfig& t : c.types) rate_keys.insert(t.rate_key());
  for (size_t i = 0; i < c.tenants.size(); ++i) {
    const TenantConfig& t = c.tenants[i];
    const std::string key = absl::StrCat("tenants[", i, "]");
    if (t.name.empty() || t.name.size() > 256) {
      return Bad(absl::StrCat(key, ".name"), "want 1-256 bytes");
    }
    if (!names.insert(t.name).second) {
      return Bad(absl::StrCat(key, ".name"), absl::StrCat("duplicate tenant \"", t.name, "\""));
    }
    if (t.principals.empty()) {
      return Bad(absl::StrCat(key, ".principals"), "name at least one principal");
    }
    for (size_t j = 0; j < t.principals.size(); ++j) {
      auto [it, fresh] = principal_of.try_emplace(t.principals[j], i);
      if (!fresh) {
        return Bad(absl::StrCat(key, ".principals[", j, "]"),
                   absl::StrCat("principal \"", t.principals[j], "\" is already in tenants[",
                                it->second, "]"));
      }
    }
    if (!(t.weight >= 0.001 && t.weight <= 1e6)) {
      return Bad(absl::StrCat(key, ".weight"),
                 absl::StrCat("must be in [0.001, 1000000], got ", t.weight));
    }
    if (t.max_active < 1) {
      return Bad(absl::StrCat(key, ".max_active"),
                 absl::StrCat("must be >= 1, got ", t.max_active));
    }
    if (t.max_running < 1) {
      return Bad(absl::StrCat(key, ".max_running"),
                 absl::StrCat("must be >= 1, got ", t.max_running));
    }
    if (t.min_running < 0 || t.min_running > t.max_running) {
      return Bad(absl::StrCat(key, ".min_running"),
                 absl::StrCat("must be in [0, max_running], got ", t.min_running));
    }
    absl::flat_hash_set<absl::string_view> limited;
    for (size_t j = 0; j < t.rates.size(); ++j) {
      const TenantRate& r = t.rates[j];
      const std::string rkey = absl::StrCat(key, ".rates[", j, "]");
      if (!rate_keys.contains(r.model)) {
        return Bad(absl::StrCat(rkey, ".model"),
                   absl::StrCat("no type has model (or is the model-less type) \"", r.model, "\""));
      }
      if (!limited.insert(r.model).second) {
        return Bad(absl::StrCat(rkey, ".model"),
                   absl::StrCat("model \"", r.model, "\" already has a rate in this tenant"));
      }
      if (!(r.rate.per_second > 0 && r.rate.per_second <= 1e9)) {
        return Bad(absl::StrCat(rkey, ".rps"),
                   absl::StrCat("must be in (0, 1e9], got ", r.rate.per_second));
      }
      if (r.rate.burst < 1) {
        return Bad(absl::StrCat(rkey, ".burst"), absl::StrCat("must be >= 1, got ", r.rate.burst));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Config::MaxMessageBytes() const {
  if (limits.max_message_bytes != 0) return limits.max_message_bytes;
  return std::max<int64_t>(max_payload_bytes, 4 << 20) + (1 << 20);
}

bool IsLoopbackAddress(absl::string_view host_port) {
  absl::string_view host = host_port.substr(0, host_port.rfind(':'));
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status Config::Validate() const {
  if (!ValidListen(listen))
    return Bad("listen", absl::StrCat("want host:port, got \"", listen, "\""));
  if (state_dir.empty()) return Bad("state_dir", "must not be empty");
  static constexpr absl::string_view kLevels[] = {"trace", "debug", "info", "warn", "error"};
  bool level_ok = false;
  for (absl::string_view l : kLevels) level_ok |= (l == log_level);
  if (!level_ok) {
    return Bad("log_level",
               absl::StrCat("want trace, debug, info, warn or error, got \"", log_level, "\""));
  }
  if (max_payload_bytes < 1 || max_payload_bytes > (int64_t{64} << 20)) {
    return Bad("max_payload_bytes",
               absl::StrCat("must be in [1, 67108864], got ", max_payload_bytes));
  }
  if (heartbeat_interval <= absl::ZeroDuration()) {
    return Bad("heartbeat_interval", "must be positive");
  }
  if (worker_stale_after <= 2 * heartbeat_interval) {
    return Bad("worker_stale_after",
               absl::StrCat("must be more than twice heartbeat_interval (",
                            absl::FormatDuration(heartbeat_interval), "), got ",
                            absl::FormatDuration(worker_stale_after)));
  }
  if (orphan_grace < absl::ZeroDuration()) return Bad("orphan_grace", "must not be negative");
  if (stop_grace < absl::ZeroDuration() || stop_grace > absl::Hours(1)) {
    return Bad("stop_grace",
               absl::StrCat("must be in [0s, 1h], got ", absl::FormatDuration(stop_grace)));
  }
  if (postgres.pool_size < 1 || postgres.pool_size > 256) {
    return Bad("postgres.pool_size", absl::StrCat("must be in [1, 256], got ", postgres.pool_size));
  }
  if (postgres.turns_in_flight < 0 || postgres.turns_in_flight > 64) {
    return Bad("postgres.turns_in_flight",
               absl::StrCat("must be in [0, 64], got ", postgres.turns_in_flight));
  }
  if (postgres.connect_wait < absl::ZeroDuration()) {
    return Bad("postgres.connect_wait", "must not be negative");
  }
  if (postgres.url.empty() && postgres.embedded_user.empty()) {
    return Bad("postgres.embedded_user", "must not be empty when postgres.url is empty");
  }
  if (max_active < 1) return Bad("max_active", absl::StrCat("must be >= 1, got ", max_active));
  if (absl::Status s = ValidateLimits(limits, max_payload_bytes); !s.ok()) return s;
  if (idempotency_window < absl::ZeroDuration()) {
    return Bad("idempotency_window", "must not be negative");
  }
  if (retention < absl::Seconds(1) || retention > absl::Hours(24 * 3650)) {
    return Bad("retention", absl::StrCat("must be between 1s and 3650 days, got ",
                                         absl::FormatDuration(retention)));
  }
  if (scheduler.policy != "fair" && scheduler.policy != "fifo") {
    return Bad("scheduler.policy",
               absl::StrCat("want fair or fifo, got \"", scheduler.policy, "\""));
  }
  if (!(scheduler.cost_alpha > 0 && scheduler.cost_alpha <= 1)) {
    return Bad("scheduler.cost_alpha",
               absl::StrCat("must be in (0, 1], got ", scheduler.cost_alpha));
  }
  if (scheduler.key_ttl <= absl::ZeroDuration())
    return Bad("scheduler.key_ttl", "must be positive");
  if (scheduler.queue_window < 16 || scheduler.queue_window > 1'000'000) {
    return Bad("scheduler.queue_window",
               absl::StrCat("must be in [16, 1000000], got ", scheduler.queue_window));
  }
  for (const auto& [key, throttle, resume] :
       {std::tuple{"ram", memory_throttle.ram_percent, memory_throttle.ram_resume_percent},
        std::tuple{"gpu", memory_throttle.gpu_percent, memory_throttle.gpu_resume_percent}}) {
    if (!(throttle > 0 && throttle <= 100)) {
      return Bad(absl::StrCat("memory_throttle.", key, "_percent"),
                 absl::StrCat("must be in (0, 100], got ", throttle));
    }
    if (!(resume >= 0 && resume < throttle)) {
      return Bad(
          absl::StrCat("memory_throttle.", key, "_resume_percent"),
          absl::StrCat("must be >= 0 and below ", key, "_percent (", throttle, "), got ", resume));
    }
  }
  if (overflow_hook.interval <= absl::ZeroDuration()) {
    return Bad("overflow_hook.interval", "must be positive");
  }
  if (overflow_hook.timeout <= absl::ZeroDuration()) {
    return Bad("overflow_hook.timeout", "must be positive");
  }
  if (ha.lease < absl::Milliseconds(500)) {
    return Bad("ha.lease",
               absl::StrCat("must be at least 500ms, got ", absl::FormatDuration(ha.lease)));
  }
  if (!metrics.listen.empty() && !ValidListen(metrics.listen)) {
    return Bad("metrics.listen", absl::StrCat("want host:port, got \"", metrics.listen, "\""));
  }
  if (!ha.advertise_address.empty() && !ValidListen(ha.advertise_address)) {
    return Bad("ha.advertise_address",
               absl::StrCat("want host:port, got \"", ha.advertise_address, "\""));
  }
  if (absl::Status s = ValidateSecurity(*this); !s.ok()) return s;
  absl::flat_hash_set<absl::string_view> tier_names;
  for (size_t i = 0; i < tiers.size(); ++i) {
    std::string key = absl::StrCat("tiers[", i, "]");
    if (!ValidTypeName(tiers[i].name)) {
      return Bad(absl::StrCat(key, ".name"),
                 absl::StrCat("want 1-128 of [A-Za-z0-9._-], got \"", tiers[i].name, "\""));
    }
    if (!tier_names.insert(tiers[i].name).second) {
      return Bad(absl::StrCat(key, ".name"),
                 absl::StrCat("duplicate tier \"", tiers[i].name, "\""));
    }
    if (tiers[i].value < 1) {
      return Bad(absl::StrCat(key, ".value"), absl::StrCat("must be >= 1, got ", tiers[i].value));
    }
  }
  if (types.empty()) return Bad("types", "at least one job type is required");
  // Types that share a model share its bucket and its VRAM: their settings must agree.
  struct ModelSetting {
    size_t type_index;
    double vram_gb;
    RateLimit rate;
  };
  absl::flat_hash_map<std::string, ModelSetting> models;
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < types.size(); ++i) {
    const JobTypeConfig& t = types[i];
    std::string key = absl::StrCat("types[", i, "]");
    if (!ValidTypeName(t.name)) {
      return Bad(absl::StrCat(key, ".name"),
                 absl::StrCat("want 1-128 of [A-Za-z0-9._-], got \"", t.name, "\""));
    }
    if (!seen.insert(t.name).second) {
      return Bad(absl::StrCat(key, ".name"), absl::StrCat("duplicate type \"", t.name, "\""));
    }
    if (t.max_concurrency < 1) {
      return Bad(absl::StrCat(key, ".max_concurrency"),
                 absl::StrCat("must be >= 1, got ", t.max_concurrency));
    }
    if (t.max_attempts < 1 || t.max_attempts > 100) {
      return Bad(absl::StrCat(key, ".max_attempts"),
                 absl::StrCat("must be in [1, 100], got ", t.max_attempts));
    }
    if (t.timeout <= absl::ZeroDuration()) {
      return Bad(absl::StrCat(key, ".timeout"), "must be positive");
    }
    if (t.retry_backoff < absl::ZeroDuration()) {
      return Bad(absl::StrCat(key, ".retry_backoff"), "must not be negative");
    }
    if (t.max_backoff < t.retry_backoff) {
      return Bad(absl::StrCat(key, ".max_backoff"), "must be >= retry_backoff");
    }
    if (!t.tier.empty() && FindTier(t.tier) == nullptr) {
      return Bad(absl::StrCat(key, ".tier"), absl::StrCat("unknown tier \"", t.tier, "\""));
    }
    if (!(t.default_cost > 0)) {
      return Bad(absl::StrCat(key, ".default_cost"),
                 absl::StrCat("must be > 0, got ", t.default_cost));
    }
    if (t.vram_gb >= 0 && t.model.empty()) {
      return Bad(absl::StrCat(key, ".vram_gb"), "needs a model (the VRAM is the model's)");
    }
    if (t.rate.per_second < 0) {
      return Bad(absl::StrCat(key, ".rps"), absl::StrCat("must be > 0, got ", t.rate.per_second));
    }
    if (t.rate.burst < 1) {
      return Bad(absl::StrCat(key, ".burst"), absl::StrCat("must be >= 1, got ", t.rate.burst));
    }
    if (t.max_queue_depth < 1) {
      return Bad(absl::StrCat(key, ".max_queue_depth"),
                 absl::StrCat("must be >= 1, got ", t.max_queue_depth));
    }
    if (t.max_affinity_wait < absl::ZeroDuration()) {
      return Bad(absl::StrCat(key, ".max_affinity_wait"), "must not be negative");
    }
    auto [it, first] = models.try_emplace(t.rate_key(), ModelSetting{i, t.vram_gb, t.rate});
    if (!first) {
      ModelSetting& m = it->second;
      if (t.vram_gb >= 0 && m.vram_gb >= 0 && t.vram_gb != m.vram_gb) {
        return Bad(absl::StrCat(key, ".vram_gb"),
                   absl::StrCat("model \"", t.model, "\" already has vram_gb ", m.vram_gb,
                                " from types[", m.type_index, "]"));
      }
      if (t.rate.limited() && m.rate.limited() && !(t.rate == m.rate)) {
        return Bad(
            absl::StrCat(key, ".rps"),
            absl::StrCat("model \"", t.model, "\" already has a different rate limit from types[",
                         m.type_index, "]"));
      }
      if (m.vram_gb < 0) m.vram_gb = t.vram_gb;
      if (!m.rate.limited()) m.rate = t.rate;
    }
  }
  return ValidateTenants(*this);
}

const TierConfig* Config::FindTier(absl::string_view name) const {
  for (const TierConfig& t : tiers) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TenantConfig* Config::TenantOf(absl::string_view principal) const {
  for (const TenantConfig& t : tenants) {
    for (const std::string& p : t.principals) {
      if (p == principal) return &t;
    }
  }
  return nullptr;
}

std::string Config::TenantNameOf(absl::string_view principal) const {
  const TenantConfig* t = TenantOf(principal);
  return t == nullptr ? std::string(principal) : t->name;
}

std::vector<std::string> Config::Warnings() const {
  // Types that share a model share its budget: one type setting vram_gb covers them all, so warn
  // once per model, and only when none of its types sets it.
  absl::flat_hash_set<absl::string_view> budgeted;
  for (const JobTypeConfig& t : types) {
    if (!t.model.empty() && t.vram_gb >= 0) budgeted.insert(t.model);
  }
  std::vector<std::string> out;
  if (postgres.turns_in_flight >= postgres.pool_size) {
    out.push_back(absl::StrCat("postgres.turns_in_flight: ", postgres.turns_in_flight,
                               " turns need as many of pool_size's ", postgres.pool_size,
                               " connections: calls wait for a connection while they are all in "
                               "flight"));
  }
  if (idempotency_window > retention) {
    out.push_back(absl::StrCat("idempotency_window: ", absl::FormatDuration(idempotency_window),
                               " is longer than retention (", absl::FormatDuration(retention),
                               "): an ended job holds its key only while it is kept"));
  }
  absl::flat_hash_set<absl::string_view> warned;
  for (size_t i = 0; i < types.size(); ++i) {
    const JobTypeConfig& t = types[i];
    if (t.model.empty() || budgeted.contains(t.model) || !warned.insert(t.model).second) continue;
    out.push_back(absl::StrCat("types[", i, "].vram_gb: type \"", t.name, "\" (model \"", t.model,
                               "\") has no VRAM budget, nor does any other type of the model; it "
                               "counts as 0 GB, so it fits beside any model on any worker"));
  }
  return out;
}

const JobTypeConfig* Config::FindType(absl::string_view name) const {
  for (const JobTypeConfig& t : types) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Config MergeReload(const Config& running, const Config& loaded,
                   std::vector<std::string>* restart_only) {
  const auto differs = [restart_only](const char* key, const auto& a, const auto& b) {
    if (!(a == b)) restart_only->push_back(key);
  };
  differs("listen", running.listen, loaded.listen);
  differs("state_dir", running.state_dir, loaded.state_dir);
  differs("max_payload_bytes", running.max_payload_bytes, loaded.max_payload_bytes);
  differs("heartbeat_interval", running.heartbeat_interval, loaded.heartbeat_interval);
  differs("worker_stale_after", running.worker_stale_after, loaded.worker_stale_after);
  differs("orphan_grace", running.orphan_grace, loaded.orphan_grace);
  differs("idempotency_window", running.idempotency_window, loaded.idempotency_window);
  differs("retention", running.retention, loaded.retention);
  differs("postgres.url", running.postgres.url, loaded.postgres.url);
  differs("postgres.pool_size", running.postgres.pool_size, loaded.postgres.pool_size);
  differs("postgres.turns_in_flight", running.postgres.turns_in_flight,
          loaded.postgres.turns_in_flight);
  differs("postgres.embedded_user", running.postgres.embedded_user, loaded.postgres.embedded_user);
  differs("postgres.bin_dir", running.postgres.bin_dir, loaded.postgres.bin_dir);
  differs("postgres.connect_wait", running.postgres.connect_wait, loaded.postgres.connect_wait);
  differs("scheduler.queue_window", running.scheduler.queue_window, loaded.scheduler.queue_window);
  differs("memory_throttle.ram_percent", running.memory_throttle.ram_percent,
          loaded.memory_throttle.ram_percent);
  differs("memory_throttle.ram_resume_percent", running.memory_throttle.ram_resume_percent,
          loaded.memory_throttle.ram_resume_percent);
  differs("memory_throttle.gpu_percent", running.memory_throttle.gpu_percent,
          loaded.memory_throttle.gpu_percent);
  differs("memory_throttle.gpu_resume_percent", running.memory_throttle.gpu_resume_percent,
          loaded.memory_throttle.gpu_resume_percent);
  differs("overflow_hook.command", running.overflow_hook.command, loaded.overflow_hook.command);
  differs("overflow_hook.interval", running.overflow_hook.interval, loaded.overflow_hook.interval);
  differs("overflow_hook.timeout", running.overflow_hook.timeout, loaded.overflow_hook.timeout);
  differs("ha.lease", running.ha.lease, loaded.ha.lease);
  differs("ha.advertise_address", running.ha.advertise_address, loaded.ha.advertise_address);
  differs("metrics.listen", running.metrics.listen, loaded.metrics.listen);
  differs("tls.cert_file", running.tls.cert_file, loaded.tls.cert_file);
  differs("tls.key_file", running.tls.key_file, loaded.tls.key_file);
  differs("tls.client_ca_file", running.tls.client_ca_file, loaded.tls.client_ca_file);
  differs("tls.client_auth", running.tls.client_auth, loaded.tls.client_auth);
  differs("tls.refresh_interval", running.tls.refresh_interval, loaded.tls.refresh_interval);
  differs("insecure", running.insecure, loaded.insecure);
  differs("limits.max_message_bytes", running.limits.max_message_bytes,
          loaded.limits.max_message_bytes);

  Config merged = running;
  merged.types = loaded.types;
  merged.tiers = loaded.tiers;
  merged.scheduler.policy = loaded.scheduler.policy;
  merged.scheduler.cost_alpha = loaded.scheduler.cost_alpha;
  merged.scheduler.key_ttl = loaded.scheduler.key_ttl;
  merged.max_active = loaded.max_active;
  merged.tenants = loaded.tenants;
  merged.log_level = loaded.log_level;
  merged.auth = loaded.auth;
  merged.limits = loaded.limits;
  merged.limits.max_message_bytes = running.limits.max_message_bytes;
  return merged;
}

}  // namespace dispatchd::config
