#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dispatchd::store {

// Where to connect, from the caller's URL: a libpq keyword/value string with connect_timeout
// added, and a description for messages (host:port/db or the socket; never the password).
struct Target {
  std::string conninfo;
  std::string endpoint;
};

// Parses `url` (a libpq URL or keyword/value string) and adds connect_timeout (whole seconds, at
// least 1, unless infinite or already given) and application_name (unless given; empty:
// "dispatchd"). InvalidArgument for a URL libpq cannot parse, with any password masked.
absl::StatusOr<Target> ParseTarget(const std::string& url, absl::Duration connect_timeout,
                                   const std::string& application_name);

}  // namespace dispatchd::store
