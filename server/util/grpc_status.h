#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace dispatchd::server {

// absl::Status and grpc::Status share their codes; this maps one onto the other 1:1.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace dispatchd::server
