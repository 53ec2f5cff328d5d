#include "proto/convert/time_proto.h"

#include <cstdint>

namespace dispatchd::proto_convert {

google::protobuf::Timestamp ToProto(absl::Time t) {
  google::protobuf::Timestamp out;
  const int64_t seconds = absl::ToUnixSeconds(t);
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(seconds))));
  return out;
}

google::protobuf::Duration ToProto(absl::Duration d) {
  google::protobuf::Duration out;
  absl::Duration rem;
  out.set_seconds(absl::IDivDuration(d, absl::Seconds(1), &rem));
  out.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(rem)));
  return out;
}

absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace dispatchd::proto_convert
