#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

#include "dispatchd/v1/job.pb.h"
#include "lib/job/job.h"

namespace dispatchd::convert {

// Wire spec -> model. Checks only what the wire form can get wrong (out-of-range durations and
// timestamps), naming the field; the rules about types and sizes live in sched::ResolveSpec.
absl::StatusOr<job::JobSpec> FromProto(const v1::JobSpec& spec);

void ToProto(const job::JobSpec& spec, v1::JobSpec* out);
void ToProto(const job::Job& job, v1::Job* out);
v1::JobState ToProto(job::JobState state);
// nullopt for JOB_STATE_UNSPECIFIED and for values this build does not know.
std::optional<job::JobState> FromProto(v1::JobState state);

// absl <-> google.protobuf well-known types. InfinitePast timestamps are left unset.
void ToProto(absl::Time t, google::protobuf::Timestamp* out);
void ToProto(absl::Duration d, google::protobuf::Duration* out);
absl::Time FromProto(const google::protobuf::Timestamp& t);
absl::Duration FromProto(const google::protobuf::Duration& d);

}  // namespace dispatchd::convert
