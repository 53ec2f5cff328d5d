#include "server/config/yaml_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "yaml-cpp/yaml.h"

namespace dispatchd::server {
namespace {

// Error carrying a position; thrown only inside this file and caught in ParseConfig.
struct ConfigError {
  YAML::Mark mark;
  std::string key;
  std::string message;
};

[[noreturn]] void Fail(const YAML::Node& node, const std::string& key, std::string message) {
  throw ConfigError{node.Mark(), key, std::move(message)};
}

std::string Scalar(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) Fail(node, key, "want a scalar value");
  return node.Scalar();
}

std::string String(const YAML::Node& node, const std::string& key) {
  if (node.IsNull()) return "";
  return Scalar(node, key);
}

int64_t Int(const YAML::Node& node, const std::string& key) {
  int64_t v = 0;
  std::string s = Scalar(node, key);
  if (!absl::SimpleAtoi(s, &v)) Fail(node, key, absl::StrCat("want an integer, got \"", s, "\""));
  return v;
}

int IntInRange(const YAML::Node& node, const std::string& key) {
  int64_t v = Int(node, key);
  if (v < -(int64_t{1} << 31) || v >= (int64_t{1} << 31)) Fail(node, key, "integer out of range");
  return static_cast<int>(v);
}

double Number(const YAML::Node& node, const std::string& key) {
  double v = 0;
  std::string s = Scalar(node, key);
  // SimpleAtod also takes "nan" and "inf"; no key here has a use for them.
  if (!absl::SimpleAtod(s, &v) || !std::isfinite(v)) {
    Fail(node, key, absl::StrCat("want a number, e.g. 2 or 0.5, got \"", s, "\""));
  }
  return v;
}

bool Bool(const YAML::Node& node, const std::string& key) {
  std::string s = Scalar(node, key);
  if (s == "true") return true;
  if (s == "false") return false;
  Fail(node, key, absl::StrCat("want true or false, got \"", s, "\""));
}

std::vector<std::string> StringList(const YAML::Node& node, const std::string& key) {
  if (!node.IsSequence()) Fail(node, key, "want a list of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < node.size(); ++i) {
    out.push_back(Scalar(node[i], absl::StrCat(key, "[", i, "]")));
  }
  return out;
}

absl::Duration Duration(const YAML::Node& node, const std::string& key) {
  std::string s = Scalar(node, key);
  absl::Duration d;
  if (!absl::ParseDuration(s, &d)) {
    Fail(node, key,
         absl::StrCat("invalid duration \"", s,
                      "\": want a number with a unit, e.g. 500ms, 30s, 10m, 2h"));
  }
  return d;
}

// The keys each mapping may hold: the parser refuses others, and KnownConfigKeys lists them.
constexpr absl::string_view kTopKeys[] = {"listen",
                                          "state_dir",
                                          "log_level",
                                          "max_payload_bytes",
                                          "heartbeat_interval",
                                          "worker_stale_after",
                                          "orphan_grace",
                                          "stop_grace",
                                          "max_active",
                                          "idempotency_window",
                                          "retention",
                                          "postgres",
                                          "scheduler",
                                          "memory_throttle",
                                          "overflow_hook",
                                          "ha",
                                          "metrics",
                                          "tls",
                                          "auth",
                                          "limits",
                                          "insecure",
                                          "tiers",
                                          "types",
                                          "tenants"};
constexpr absl::string_view kPostgresKeys[] = {"url",           "pool_size", "turns_in_flight",
                                               "embedded_user", "bin_dir",   "connect_wait"};
constexpr absl::string_view kSchedulerKeys[] = {"policy", "cost_alpha", "key_ttl", "queue_window"};
constexpr absl::string_view kOverflowHookKeys[] = {"command", "interval", "timeout"};
constexpr absl::string_view kHaKeys[] = {"lease", "advertise_address"};
constexpr absl::string_view kMetricsKeys[] = {"listen"};
constexpr absl::string_view kTlsKeys[] = {"cert_file", "key_file", "client_ca_file", "client_auth",
                                          "refresh_interval"};
constexpr absl::string_view kAuthKeys[] = {"tokens_file", "certificates"};
constexpr absl::string_view kLimitsKeys[] = {
    "max_message_bytes",     "max_labels",   "max_label_bytes",
    "max_key_bytes",         "max_id_bytes", "worker_streams_per_principal",
    "watches_per_principal", "submit_rate",  "submit_burst"};
constexpr absl::string_view kCertificateKeys[] = {"name", "principal", "role", "types"};
constexpr absl::string_view kMemoryThrottleKeys[] = {"ram_percent", "ram_resume_percent",
                                                     "gpu_percent", "gpu_resume_percent"};
constexpr absl::string_view kTierKeys[] = {"name", "value"};
constexpr absl::string_view kTenantKeys[] = {"name",        "principals",  "weight", "max_active",
                                             "max_running", "min_running", "rates"};
constexpr absl::string_view kTenantRateKeys[] = {"model", "rpm", "rps", "burst"};
constexpr absl::string_view kTypeKeys[] = {"name",
                                           "max_concurrency",
                                           "max_attempts",
                                           "timeout",
                                           "retry_backoff",
                                           "max_backoff",
                                           "on_orphan",
                                           "model",
                                           "tier",
                                           "conflict_group",
                                           "default_cost",
                                           "vram_gb",
                                           "rpm",
                                           "rps",
                                           "burst",
                                           "max_queue_depth",
                                           "max_affinity_wait"};

// Calls `fn(key, value)` for each entry of a mapping, refusing keys not in `allowed`.
template <typename Fn>
void ForEachKey(const YAML::Node& map, const std::string& path,
                absl::Span<const absl::string_view> allowed, Fn fn) {
  if (!map.IsMap()) Fail(map, path.empty() ? "(top level)" : path, "want a mapping of keys");
  for (const auto& entry : map) {
    std::string key = entry.first.as<std::string>();
    std::string full = path.empty() ? key : absl::StrCat(path, ".", key);
    bool known = false;
    for (absl::string_view a : allowed) known |= (a == key);
    if (!known) {
      Fail(entry.first, full,
           absl::StrCat("unknown key (known here: ", absl::StrJoin(allowed, ", "), ")"));
    }
    fn(key, full, entry.second);
  }
}

config::TierConfig ParseTier(const YAML::Node& node, const std::string& path) {
  config::TierConfig tier;
  bool has_value = false;
  ForEachKey(node, path, kTierKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "name") tier.name = String(v, full);
               if (key == "value") {
                 tier.value = IntInRange(v, full);
                 has_value = true;
               }
             });
  if (tier.name.empty()) Fail(node, path + ".name", "required");
  // No default: a tier's value is both its priority and its cap, so it must be chosen.
  if (!has_value) Fail(node, path + ".value", "required");
  return tier;
}

config::JobTypeConfig ParseType(const YAML::Node& node, const std::string& path) {
  config::JobTypeConfig t;
  // Rate keys are checked together after the loop: rpm and rps are two spellings of one rate.
  // Set with emplace(): YAML::Node's operator= would write into the document.
  std::optional<YAML::Node> rpm, rps, burst;
  ForEachKey(node, path, kTypeKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "name") t.name = String(v, full);
               if (key == "max_concurrency") t.max_concurrency = IntInRange(v, full);
               if (key == "max_attempts") t.max_attempts = IntInRange(v, full);
               if (key == "timeout") t.timeout = Duration(v, full);
               if (key == "retry_backoff") t.retry_backoff = Duration(v, full);
               if (key == "max_backoff") t.max_backoff = Duration(v, full);
               if (key == "model") t.model = String(v, full);
               if (key == "on_orphan") {
                 std::string s = String(v, full);
                 if (s == "requeue") {
                   t.on_orphan = config::OnOrphan::kRequeue;
                 } else if (s == "fail") {
                   t.on_orphan = config::OnOrphan::kFail;
                 } else {
                   Fail(v, full, absl::StrCat("want requeue or fail, got \"", s, "\""));
                 }
               }
               if (key == "tier") t.tier = String(v, full);
               if (key == "conflict_group") t.conflict_group = String(v, full);
               if (key == "default_cost") t.default_cost = Number(v, full);
               if (key == "vram_gb") {
                 // Negative stands for "not set" in JobTypeConfig; the file may not say it.
                 t.vram_gb = Number(v, full);
                 if (t.vram_gb < 0) Fail(v, full, absl::StrCat("must be >= 0, got ", t.vram_gb));
               }
               if (key == "rpm") {
                 rpm.emplace(v);
                 double n = Number(v, full);
                 if (!(n > 0)) Fail(v, full, absl::StrCat("must be > 0, got ", n));
                 t.rate.per_second = n / 60;
               }
               if (key == "rps") {
                 rps.emplace(v);
                 double n = Number(v, full);
                 if (!(n > 0)) Fail(v, full, absl::StrCat("must be > 0, got ", n));
                 t.rate.per_second = n;
               }
               if (key == "burst") {
                 burst.emplace(v);
                 t.rate.burst = IntInRange(v, full);
               }
               if (key == "max_queue_depth") t.max_queue_depth = IntInRange(v, full);
               if (key == "max_affinity_wait") t.max_affinity_wait = Duration(v, full);
             });
  if (t.name.empty()) Fail(node, path + ".name", "required");
  if (rpm && rps) {
    Fail(*rps, path + ".rps", "set rpm or rps, not both (rpm: per minute, rps: per second)");
  }
  if (burst && !rpm && !rps) {
    Fail(*burst, path + ".burst", "needs rpm or rps (burst is the capacity of a rate limit)");
  }
  return t;
}

config::TenantRate ParseTenantRate(const YAML::Node& node, const std::string& path) {
  config::TenantRate r;
  std::optional<YAML::Node> rpm, rps;
  ForEachKey(node, path, kTenantRateKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "model") r.model = String(v, full);
               if (key == "rpm") {
                 rpm.emplace(v);
                 r.rate.per_second = Number(v, full) / 60;
               }
               if (key == "rps") {
                 rps.emplace(v);
                 r.rate.per_second = Number(v, full);
               }
               if (key == "burst") r.rate.burst = IntInRange(v, full);
             });
  if (r.model.empty()) Fail(node, path + ".model", "required");
  if (rpm && rps) Fail(*rps, path + ".rps", "set rpm or rps, not both");
  if (!rpm && !rps) Fail(node, path + ".rps", "required (or rpm)");
  return r;
}

config::TenantConfig ParseTenant(const YAML::Node& node, const std::string& path) {
  config::TenantConfig t;
  ForEachKey(node, path, kTenantKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "name") t.name = String(v, full);
               if (key == "principals") t.principals = StringList(v, full);
               if (key == "weight") t.weight = Number(v, full);
               if (key == "max_active") t.max_active = Int(v, full);
               if (key == "max_running") t.max_running = IntInRange(v, full);
               if (key == "min_running") t.min_running = IntInRange(v, full);
               if (key == "rates") {
                 if (!v.IsSequence()) Fail(v, full, "want a list of {model, rps or rpm, burst}");
                 for (size_t i = 0; i < v.size(); ++i) {
                   t.rates.push_back(ParseTenantRate(v[i], absl::StrCat(full, "[", i, "]")));
                 }
               }
             });
  if (t.name.empty()) Fail(node, path + ".name", "required");
  return t;
}

config::TlsConfig ParseTls(const YAML::Node& node, const std::string& path) {
  config::TlsConfig tls;
  ForEachKey(node, path, kTlsKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "cert_file") tls.cert_file = String(v, full);
               if (key == "key_file") tls.key_file = String(v, full);
               if (key == "client_ca_file") tls.client_ca_file = String(v, full);
               if (key == "refresh_interval") tls.refresh_interval = Duration(v, full);
               if (key == "client_auth") {
                 std::string s = String(v, full);
                 if (s == "none") {
                   tls.client_auth = config::ClientAuth::kNone;
                 } else if (s == "request") {
                   tls.client_auth = config::ClientAuth::kRequest;
                 } else if (s == "require") {
                   tls.client_auth = config::ClientAuth::kRequire;
                 } else {
                   Fail(v, full, absl::StrCat("want none, request or require, got \"", s, "\""));
                 }
               }
             });
  return tls;
}

config::LimitsConfig ParseLimits(const YAML::Node& node, const std::string& path) {
  config::LimitsConfig l;
  std::optional<YAML::Node> burst;
  ForEachKey(node, path, kLimitsKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "max_message_bytes") l.max_message_bytes = Int(v, full);
               if (key == "max_labels") l.max_labels = IntInRange(v, full);
               if (key == "max_label_bytes") l.max_label_bytes = IntInRange(v, full);
               if (key == "max_key_bytes") l.max_key_bytes = IntInRange(v, full);
               if (key == "max_id_bytes") l.max_id_bytes = IntInRange(v, full);
               if (key == "worker_streams_per_principal") {
                 l.worker_streams_per_principal = IntInRange(v, full);
               }
               if (key == "watches_per_principal") l.watches_per_principal = IntInRange(v, full);
               if (key == "submit_rate") l.submit.per_second = Number(v, full);
               if (key == "submit_burst") {
                 burst.emplace(v);
                 l.submit.burst = IntInRange(v, full);
               }
             });
  // Without a burst of its own, the bucket holds one second of the rate.
  if (!burst && l.submit.per_second >= 1) {
    l.submit.burst = static_cast<int>(std::min(l.submit.per_second, 1e9));
  }
  return l;
}

config::CertificatePrincipal ParseCertificate(const YAML::Node& node, const std::string& path) {
  config::CertificatePrincipal cert;
  bool has_role = false;
  ForEachKey(node, path, kCertificateKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "name") cert.name = String(v, full);
               if (key == "principal") cert.principal = String(v, full);
               if (key == "types") cert.types = StringList(v, full);
               if (key == "role") {
                 absl::StatusOr<auth::Role> role = auth::ParseRole(String(v, full));
                 if (!role.ok()) Fail(v, full, std::string(role.status().message()));
                 cert.role = *role;
                 has_role = true;
               }
             });
  if (cert.name.empty()) Fail(node, path + ".name", "required");
  // No default: a certificate's role is what it may do, so it must be chosen.
  if (!has_role) Fail(node, path + ".role", "required");
  if (cert.principal.empty()) cert.principal = cert.name;
  return cert;
}

config::AuthConfig ParseAuth(const YAML::Node& node, const std::string& path) {
  config::AuthConfig auth;
  ForEachKey(
      node, path, kAuthKeys,
      [&](const std::string& key, const std::string& full, const YAML::Node& v) {
        if (key == "tokens_file") auth.tokens_file = String(v, full);
        if (key == "certificates") {
          if (!v.IsSequence()) Fail(v, full, "want a list of {name, principal, role}");
          for (size_t i = 0; i < v.size(); ++i) {
            auth.certificates.push_back(ParseCertificate(v[i], absl::StrCat(full, "[", i, "]")));
          }
        }
      });
  return auth;
}

config::Config ParseRoot(const YAML::Node& root) {
  config::Config c;
  if (root.IsNull()) return c;
  ForEachKey(root, "", kTopKeys,
             [&](const std::string& key, const std::string& full, const YAML::Node& v) {
               if (key == "listen") c.listen = String(v, full);
               if (key == "state_dir") c.state_dir = String(v, full);
               if (key == "log_level") c.log_level = String(v, full);
               if (key == "max_payload_bytes") c.max_payload_bytes = Int(v, full);
               if (key == "heartbeat_interval") c.heartbeat_interval = Duration(v, full);
               if (key == "worker_stale_after") c.worker_stale_after = Duration(v, full);
               if (key == "orphan_grace") c.orphan_grace = Duration(v, full);
               if (key == "stop_grace") c.stop_grace = Duration(v, full);
               if (key == "max_active") c.max_active = Int(v, full);
               if (key == "idempotency_window") c.idempotency_window = Duration(v, full);
               if (key == "retention") c.retention = Duration(v, full);
               if (key == "postgres") {
                 ForEachKey(v, full, kPostgresKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& pv) {
                              if (k == "url") c.postgres.url = String(pv, f);
                              if (k == "pool_size") c.postgres.pool_size = IntInRange(pv, f);
                              if (k == "turns_in_flight") {
                                c.postgres.turns_in_flight = IntInRange(pv, f);
                              }
                              if (k == "embedded_user") c.postgres.embedded_user = String(pv, f);
                              if (k == "bin_dir") c.postgres.bin_dir = String(pv, f);
                              if (k == "connect_wait") c.postgres.connect_wait = Duration(pv, f);
                            });
               }
               if (key == "scheduler") {
                 ForEachKey(v, full, kSchedulerKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& sv) {
                              if (k == "policy") c.scheduler.policy = String(sv, f);
                              if (k == "cost_alpha") c.scheduler.cost_alpha = Number(sv, f);
                              if (k == "key_ttl") c.scheduler.key_ttl = Duration(sv, f);
                              if (k == "queue_window") c.scheduler.queue_window = Int(sv, f);
                            });
               }
               if (key == "overflow_hook") {
                 ForEachKey(v, full, kOverflowHookKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& hv) {
                              if (k == "command") c.overflow_hook.command = String(hv, f);
                              if (k == "interval") c.overflow_hook.interval = Duration(hv, f);
                              if (k == "timeout") c.overflow_hook.timeout = Duration(hv, f);
                            });
               }
               if (key == "ha") {
                 ForEachKey(v, full, kHaKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& hv) {
                              if (k == "lease") c.ha.lease = Duration(hv, f);
                              if (k == "advertise_address") c.ha.advertise_address = String(hv, f);
                            });
               }
               if (key == "metrics") {
                 ForEachKey(v, full, kMetricsKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& mv) {
                              if (k == "listen") c.metrics.listen = String(mv, f);
                            });
               }
               if (key == "tls") c.tls = ParseTls(v, full);
               if (key == "auth") c.auth = ParseAuth(v, full);
               if (key == "limits") c.limits = ParseLimits(v, full);
               if (key == "insecure") c.insecure = Bool(v, full);
               if (key == "memory_throttle") {
                 config::MemoryThrottleConfig& m = c.memory_throttle;
                 ForEachKey(v, full, kMemoryThrottleKeys,
                            [&](const std::string& k, const std::string& f, const YAML::Node& mv) {
                              if (k == "ram_percent") m.ram_percent = Number(mv, f);
                              if (k == "ram_resume_percent") m.ram_resume_percent = Number(mv, f);
                              if (k == "gpu_percent") m.gpu_percent = Number(mv, f);
                              if (k == "gpu_resume_percent") m.gpu_resume_percent = Number(mv, f);
                            });
               }
               if (key == "tiers") {
                 if (!v.IsSequence()) Fail(v, full, "want a list of {name, value} mappings");
                 for (size_t i = 0; i < v.size(); ++i) {
                   c.tiers.push_back(ParseTier(v[i], absl::StrCat("tiers[", i, "]")));
                 }
               }
               if (key == "tenants") {
                 if (!v.IsSequence()) Fail(v, full, "want a list of tenants");
                 for (size_t i = 0; i < v.size(); ++i) {
                   c.tenants.push_back(ParseTenant(v[i], absl::StrCat("tenants[", i, "]")));
                 }
               }
               if (key == "types") {
                 if (!v.IsSequence()) Fail(v, full, "want a list of job types");
                 for (size_t i = 0; i < v.size(); ++i) {
                   c.types.push_back(ParseType(v[i], absl::StrCat("types[", i, "]")));
                 }
               }
             });
  return c;
}

// Finds the node for a validation error's key path ("types[1].timeout") to report its position.
YAML::Mark MarkOf(const YAML::Node& root, absl::string_view key_path) {
  YAML::Node node = root;
  YAML::Mark best = root.Mark();
  std::string path(key_path);
  size_t pos = 0;
  while (pos < path.size() && node && node.IsDefined()) {
    size_t end = path.find_first_of(".[", pos);
    std::string part = path.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (!part.empty()) {
      if (!node.IsMap() || !node[part]) break;
      node = node[part];
      best = node.Mark();
    }
    if (end == std::string::npos) break;
    if (path[end] == '[') {
      size_t close = path.find(']', end);
      size_t index = 0;
      if (close == std::string::npos ||
          !absl::SimpleAtoi(path.substr(end + 1, close - end - 1), &index) || !node.IsSequence() ||
          index >= node.size()) {
        break;
      }
      node = node[index];
      best = node.Mark();
      pos = close + 1;
      if (pos < path.size() && path[pos] == '.') ++pos;
    } else {
      pos = end + 1;
    }
  }
  return best;
}

std::string Position(absl::string_view name, const YAML::Mark& mark) {
  if (mark.is_null()) return std::string(name);
  return absl::StrCat(name, ":", mark.line + 1, ":", mark.column + 1);
}

}  // namespace

absl::StatusOr<config::Config> ParseConfig(absl::string_view yaml, absl::string_view name) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(Position(name, e.mark), ": ", e.msg));
  }
  config::Config config;
  try {
    config = ParseRoot(root);
  } catch (const ConfigError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Position(name, e.mark), ": ", e.key, ": ", e.message));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(Position(name, e.mark), ": ", e.msg));
  }
  if (absl::Status s = config.Validate(); !s.ok()) {
    // Validate says "key: why"; put the position of that key in front.
    absl::string_view msg = s.message();
    absl::string_view key = msg.substr(0, msg.find(':'));
    return absl::InvalidArgumentError(absl::StrCat(Position(name, MarkOf(root, key)), ": ", msg));
  }
  return config;
}

absl::StatusOr<config::Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open config file: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

std::vector<std::string> KnownConfigKeys() {
  std::vector<std::string> keys(std::begin(kTopKeys), std::end(kTopKeys));
  const std::pair<absl::string_view, absl::Span<const absl::string_view>> sections[] = {
      {"postgres", kPostgresKeys},
      {"scheduler", kSchedulerKeys},
      {"memory_throttle", kMemoryThrottleKeys},
      {"overflow_hook", kOverflowHookKeys},
      {"ha", kHaKeys},
      {"metrics", kMetricsKeys},
      {"tls", kTlsKeys},
      {"auth", kAuthKeys},
      {"auth.certificates[]", kCertificateKeys},
      {"limits", kLimitsKeys},
      {"tiers[]", kTierKeys},
      {"types[]", kTypeKeys},
      {"tenants[]", kTenantKeys},
      {"tenants[].rates[]", kTenantRateKeys}};
  for (const auto& [section, names] : sections) {
    for (absl::string_view name : names) keys.push_back(absl::StrCat(section, ".", name));
  }
  return keys;
}

}  // namespace dispatchd::server
