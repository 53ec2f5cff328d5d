#include "lib/sched/admission.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dispatchd::sched {
namespace {

constexpr int kMaxAttempts = 100;

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, ": ", why));
}

bool PrintableAscii(absl::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

absl::Status CheckKey(const config::LimitsConfig& limits, absl::string_view field,
                      absl::string_view value) {
  if (value.size() > static_cast<size_t>(limits.max_key_bytes)) {
    return Bad(field, absl::StrCat("at most ", limits.max_key_bytes,
                                   " bytes (limits.max_key_bytes), got ", value.size()));
  }
  if (!PrintableAscii(value)) return Bad(field, "must be printable ASCII");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<job::JobSpec> ResolveSpec(const config::Config& config, job::JobSpec spec) {
  if (spec.type.empty()) return Bad("type", "required");
  const config::JobTypeConfig* type = config.FindType(spec.type);
  if (type == nullptr) {
    std::vector<std::string> names;
    for (const config::JobTypeConfig& t : config.types) names.push_back(t.name);
    return Bad("type",
               absl::StrCat("unknown job type \"", absl::CHexEscape(spec.type.substr(0, 64)),
                            "\" (configured: ", absl::StrJoin(names, ", "), ")"));
  }
  if (spec.payload.empty()) return Bad("payload", "required (at least one byte)");
  if (static_cast<int64_t>(spec.payload.size()) > config.max_payload_bytes) {
    return Bad("payload", absl::StrCat(spec.payload.size(), " bytes exceeds max_payload_bytes (",
                                       config.max_payload_bytes, ")"));
  }
  if (absl::Status s = CheckKey(config.limits, "resource_id", spec.resource_id); !s.ok()) return s;
  if (absl::Status s = CheckKey(config.limits, "fairness_key", spec.fairness_key); !s.ok())
    return s;
  if (absl::Status s = CheckKey(config.limits, "idempotency_key", spec.idempotency_key); !s.ok())
    return s;
  if (spec.max_attempts < 0 || spec.max_attempts > kMaxAttempts) {
    return Bad("max_attempts",
               absl::StrCat("must be in [0, ", kMaxAttempts, "], got ", spec.max_attempts));
  }
  if (spec.max_attempts == 0) spec.max_attempts = type->max_attempts;
  if (spec.timeout < absl::ZeroDuration()) return Bad("timeout", "must not be negative");
  if (spec.timeout == absl::ZeroDuration()) spec.timeout = type->timeout;
  if (spec.timeout > absl::Hours(24 * 7)) return Bad("timeout", "at most 168h");
  if (spec.dispatch_deadline <= absl::ZeroDuration()) {
    return Bad("dispatch_deadline", "must be positive when set");
  }
  const config::LimitsConfig& limits = config.limits;
  if (spec.labels.size() > static_cast<size_t>(limits.max_labels)) {
    return Bad("labels", absl::StrCat("at most ", limits.max_labels,
                                      " labels (limits.max_labels), got ", spec.labels.size()));
  }
  const size_t max_label = static_cast<size_t>(limits.max_label_bytes);
  for (const auto& [key, value] : spec.labels) {
    if (key.empty() || key.size() > max_label || !PrintableAscii(key) ||
        key.find_first_of("=, ") != std::string::npos) {
      return Bad("labels", absl::StrCat("bad label key \"", absl::CHexEscape(key.substr(0, 64)),
                                        "\": want 1 to ", max_label,
                                        " (limits.max_label_bytes) printable characters without "
                                        "'=', ',' or space"));
    }
    if (value.size() > max_label || !PrintableAscii(value)) {
      return Bad(absl::StrCat("labels[", key, "]"),
                 absl::StrCat("value must be at most ", max_label,
                              " (limits.max_label_bytes) printable characters"));
    }
  }
  return spec;
}

absl::Duration RetryBackoff(const config::JobTypeConfig& type, int attempt) {
  absl::Duration d = type.retry_backoff;
  for (int i = 1; i < attempt && d < type.max_backoff; ++i) d *= 2;
  return std::min(d, type.max_backoff);
}

absl::Duration RetryBackoff(const config::JobTypeConfig& type, int attempt,
                            absl::string_view job_id) {
  const absl::Duration ceiling = RetryBackoff(type, attempt);
  // FNV-1a of (job id, attempt): stable across runs and restarts, spread across jobs.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](unsigned char c) { h = (h ^ c) * 1099511628211ull; };
  for (char c : job_id) mix(static_cast<unsigned char>(c));
  for (int i = 0; i < 4; ++i) mix(static_cast<unsigned char>(attempt >> (8 * i)));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
  return ceiling / 2 + (ceiling / 2) * u;
}

}  // namespace dispatchd::sched
