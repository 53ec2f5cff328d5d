#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dispatchd::server {

struct EmbeddedPostgresOptions {
  // The daemon's state directory; the server lives in `<state_dir>/pg`.
  std::string state_dir;
  // Directory with initdb, pg_ctl and postgres.
  std::string bin_dir = "/usr/lib/postgresql/15/bin";
  // OS user the server runs as when the daemon runs as root (PostgreSQL refuses root).
  std::string run_as_user = "postgres";
  // Database the daemon uses.
  std::string database = "dispatchd";
  absl::Duration start_timeout = absl::Seconds(60);
};

// A private PostgreSQL server owned by the daemon: initialized under the state directory on first
// use, listening only on a unix socket there (no TCP), started when the daemon starts and stopped
// when this object is destroyed. A server left running by a daemon that was killed is adopted, so
// a restart after `kill -9` finds its data where it left it.
//
// Usage:
//   auto pg = EmbeddedPostgres::Start(options);   // then connect to (*pg)->url()
//
// Thread-compatible.
class EmbeddedPostgres {
 public:
  static absl::StatusOr<std::unique_ptr<EmbeddedPostgres>> Start(
      const EmbeddedPostgresOptions& options);
  ~EmbeddedPostgres();
  EmbeddedPostgres(const EmbeddedPostgres&) = delete;
  EmbeddedPostgres& operator=(const EmbeddedPostgres&) = delete;

  // libpq URL of the daemon's database over the unix socket.
  const std::string& url() const { return url_; }

 private:
  EmbeddedPostgres(EmbeddedPostgresOptions options, std::string url, uid_t uid, gid_t gid)
      : options_(std::move(options)), url_(std::move(url)), uid_(uid), gid_(gid) {}

  EmbeddedPostgresOptions options_;
  std::string url_;
  uid_t uid_;
  gid_t gid_;
};

}  // namespace dispatchd::server
