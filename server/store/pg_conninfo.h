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

// Parses `url` (a libpq URL or keyword/value string) and adds:
//  - connect_timeout: whole seconds, at least 1, unless infinite or already given;
//  - application_name: `application_name` replaces any the URL gives, because a new leader finds
//    a frozen leader's sessions by it; empty keeps the URL's, or else "dispatchd";
//  - TCP liveness, unless the URL sets it: keepalives (probe after 10 s idle, every 5 s, give up
//    after 3) and tcp_user_timeout = `tcp_user_timeout` (a write unacknowledged that long breaks
//    the session), so that a peer gone silent ends a session rather than hanging it.
// InvalidArgument for a URL libpq cannot parse, with any password masked.
absl::StatusOr<Target> ParseTarget(const std::string& url, absl::Duration connect_timeout,
                                   const std::string& application_name,
                                   absl::Duration tcp_user_timeout = absl::Seconds(30));

}  // namespace dispatchd::store
