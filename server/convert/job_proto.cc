#include "server/convert/job_proto.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dispatchd::convert {
namespace {

// google.protobuf.Duration and Timestamp bounds (10000 years).
constexpr int64_t kMaxSeconds = 315'576'000'000;

absl::Status BadDuration(absl::string_view field, const google::protobuf::Duration& d) {
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.", field, ": invalid duration (seconds=", d.seconds(), ", nanos=", d.nanos(),
      "): want 0 <= seconds <= ", kMaxSeconds, " and 0 <= nanos < 1e9"));
}

bool ValidDuration(const google::protobuf::Duration& d) {
  return d.seconds() >= 0 && d.seconds() <= kMaxSeconds && d.nanos() >= 0 &&
         d.nanos() < 1'000'000'000;
}

}  // namespace

absl::StatusOr<job::JobSpec> FromProto(const v1::JobSpec& in) {
  job::JobSpec spec;
  spec.type = in.type();
  spec.payload = in.payload();
  spec.resource_id = in.resource_id();
  spec.fairness_key = in.fairness_key();
  spec.idempotency_key = in.idempotency_key();
  spec.max_attempts = in.max_attempts();
  if (in.has_timeout()) {
    if (!ValidDuration(in.timeout())) return BadDuration("timeout", in.timeout());
    spec.timeout = FromProto(in.timeout());
    if (spec.timeout == absl::ZeroDuration()) {
      return absl::InvalidArgumentError("spec.timeout: must be positive when set");
    }
  }
  if (in.has_dispatch_deadline()) {
    if (!ValidDuration(in.dispatch_deadline())) {
      return BadDuration("dispatch_deadline", in.dispatch_deadline());
    }
    spec.dispatch_deadline = FromProto(in.dispatch_deadline());
  }
  if (in.has_not_before()) {
    const google::protobuf::Timestamp& t = in.not_before();
    if (t.seconds() < 0 || t.seconds() > 253'402'300'799 || t.nanos() < 0 ||
        t.nanos() >= 1'000'000'000) {
      return absl::InvalidArgumentError("spec.not_before: invalid timestamp");
    }
    spec.not_before = FromProto(t);
  }
  for (const auto& [k, v] : in.labels()) spec.labels[k] = v;
  return spec;
}

void ToProto(const job::JobSpec& spec, v1::JobSpec* out) {
  out->set_type(spec.type);
  out->set_payload(spec.payload);
  out->set_resource_id(spec.resource_id);
  out->set_fairness_key(spec.fairness_key);
  out->set_idempotency_key(spec.idempotency_key);
  out->set_max_attempts(spec.max_attempts);
  if (spec.timeout > absl::ZeroDuration()) ToProto(spec.timeout, out->mutable_timeout());
  if (spec.dispatch_deadline != absl::InfiniteDuration()) {
    ToProto(spec.dispatch_deadline, out->mutable_dispatch_deadline());
  }
  if (spec.not_before != absl::InfinitePast()) ToProto(spec.not_before, out->mutable_not_before());
  for (const auto& [k, v] : spec.labels) (*out->mutable_labels())[k] = v;
}

v1::JobState ToProto(job::JobState state) {
  switch (state) {
    case job::JobState::kQueued:
      return v1::JOB_STATE_QUEUED;
    case job::JobState::kDispatched:
      return v1::JOB_STATE_DISPATCHED;
    case job::JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case job::JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case job::JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case job::JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
    case job::JobState::kExpired:
      return v1::JOB_STATE_EXPIRED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

std::optional<job::JobState> FromProto(v1::JobState state) {
  for (job::JobState s :
       {job::JobState::kQueued, job::JobState::kDispatched, job::JobState::kRunning,
        job::JobState::kSucceeded, job::JobState::kFailed, job::JobState::kCancelled,
        job::JobState::kExpired}) {
    if (ToProto(s) == state) return s;
  }
  return std::nullopt;
}

void ToProto(const job::Job& job, v1::Job* out) {
  out->set_id(job.id);
  ToProto(job.spec, out->mutable_spec());
  out->set_state(ToProto(job.state));
  out->set_attempt(job.attempt);
  out->set_max_attempts(job.spec.max_attempts);
  out->set_worker_id(job.worker_id);
  out->set_result(job.result);
  out->set_error(job.error);
  out->set_fairness_key(job.spec.fairness_key);
  out->set_owner(job.owner);
  ToProto(job.created_at, out->mutable_created_at());
  ToProto(job.dispatched_at, out->mutable_dispatched_at());
  ToProto(job.started_at, out->mutable_started_at());
  ToProto(job.finished_at, out->mutable_finished_at());
  ToProto(job.updated_at, out->mutable_updated_at());
  // Unset times stay unset rather than the epoch.
  if (job.created_at == absl::InfinitePast()) out->clear_created_at();
  if (job.dispatched_at == absl::InfinitePast()) out->clear_dispatched_at();
  if (job.started_at == absl::InfinitePast()) out->clear_started_at();
  if (job.finished_at == absl::InfinitePast()) out->clear_finished_at();
  if (job.updated_at == absl::InfinitePast()) out->clear_updated_at();
  out->clear_earlier_attempts();
  for (const job::EndedAttempt& a : job.earlier_attempts) {
    v1::JobAttempt* p = out->add_earlier_attempts();
    p->set_attempt(a.attempt);
    p->set_worker_id(a.worker_id);
    p->set_error(a.error);
    // Unset times stay unset, as above.
    if (a.dispatched_at != absl::InfinitePast())
      ToProto(a.dispatched_at, p->mutable_dispatched_at());
    if (a.started_at != absl::InfinitePast()) ToProto(a.started_at, p->mutable_started_at());
    if (a.ended_at != absl::InfinitePast()) ToProto(a.ended_at, p->mutable_ended_at());
  }
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return;
  int64_t micros = absl::ToUnixMicros(t);
  int64_t secs = micros / 1'000'000;
  int64_t rem = micros % 1'000'000;
  if (rem < 0) {
    rem += 1'000'000;
    --secs;
  }
  out->set_seconds(secs);
  out->set_nanos(static_cast<int32_t>(rem * 1000));
}

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  // Whole seconds, then the nanoseconds left over, both truncated toward zero as the message
  // wants: exact over the message's whole range (10000 years), where a count of nanoseconds in
  // an int64 saturates past about 292 years.
  const int64_t seconds = absl::ToInt64Seconds(d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d - absl::Seconds(seconds))));
}

absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace dispatchd::convert
