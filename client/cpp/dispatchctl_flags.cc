#include "client/cpp/dispatchctl_flags.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "proto/convert/time_proto.h"

namespace dispatchd::client::ctl {

absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, const std::string& text) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration() ||
      d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": invalid duration \"", text, "\" (e.g. 30s, 1.5m, 2h)"));
  }
  return d;
}

void SpecFlags::Register(CLI::App* cmd) {
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

absl::StatusOr<v1::JobSpec> SpecFlags::Build() const {
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
    absl::StatusOr<absl::Duration> d = ParseDurationFlag("--dispatch-deadline", dispatch_deadline);
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

}  // namespace dispatchd::client::ctl
