#pragma once

// absl::Time and absl::Duration to and from google.protobuf.Timestamp and Duration, for the
// client and the daemon alike (the time is converted only at the wire's edge).
//
//   *spec.mutable_timeout() = proto_convert::ToProto(absl::Seconds(30));
//   absl::Time at = proto_convert::FromProto(job.updated_at());
//
// Pure functions of their argument; thread-safe.

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace dispatchd::proto_convert {

// Whole seconds rounded toward the infinite past and the nanoseconds after them, so that `nanos`
// is in [0, 1e9) as the message requires. REQUIRES: `t` is finite.
google::protobuf::Timestamp ToProto(absl::Time t);

// Whole seconds and the nanoseconds left over, both truncated toward zero (so both have the
// duration's sign, as the message requires); exact over the message's whole range (10000 years).
// REQUIRES: `d` is finite.
google::protobuf::Duration ToProto(absl::Duration d);

absl::Time FromProto(const google::protobuf::Timestamp& t);
absl::Duration FromProto(const google::protobuf::Duration& d);

}  // namespace dispatchd::proto_convert
