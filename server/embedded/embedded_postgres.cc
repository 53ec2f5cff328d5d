#include "server/embedded/embedded_postgres.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pqxx/pqxx"
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dispatchd::server {
namespace {

namespace fs = std::filesystem;

struct Paths {
  std::string root;    // <state_dir>/pg
  std::string data;    // <root>/data
  std::string socket;  // <root>/run
  std::string log;     // <root>/server.log
};

Paths PathsFor(const std::string& state_dir) {
  std::string root = (fs::path(state_dir) / "pg").string();
  return Paths{root, root + "/data", root + "/run", root + "/server.log"};
}

// Runs argv as uid/gid (when the daemon is root), waits, and returns its exit code; output goes
// to `log_path`.
absl::StatusOr<int> RunAs(const std::vector<std::string>& argv, uid_t uid, gid_t gid,
                          const std::string& log_path) {
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Drop privileges first, so that files the child creates belong to the server's user.
    if (geteuid() == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
    }
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    setsid();  // the server must not die with the daemon's process group
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Tail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

absl::Status ChownTree(const std::string& root, uid_t uid, gid_t gid) {
  std::error_code ec;
  if (chown(root.c_str(), uid, gid) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chown ", root, ": ", std::strerror(errno)));
  }
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (lchown(it->path().c_str(), uid, gid) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("chown ", it->path().string(), ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedPostgres>> EmbeddedPostgres::Start(
    const EmbeddedPostgresOptions& options) {
  const Paths paths = PathsFor(options.state_dir);
  for (const char* bin : {"initdb", "pg_ctl", "postgres"}) {
    std::string p = absl::StrCat(options.bin_dir, "/", bin);
    if (access(p.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("embedded postgres: ", p,
                       " not found (install postgresql-15, or set postgres.bin_dir, "
                       "or point postgres.url at a server)"));
    }
  }
  if (paths.socket.size() + 20 > 107) {
    return absl::InvalidArgumentError(absl::StrCat("state_dir: too long for a unix socket path (",
                                                   paths.socket, "); use a shorter state_dir"));
  }

  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (uid == 0) {
    struct passwd* pw = getpwnam(options.run_as_user.c_str());
    if (pw == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "postgres.embedded_user: no such user \"", options.run_as_user,
          "\" (PostgreSQL refuses to run as root; create the user or set postgres.embedded_user)"));
    }
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }

  std::error_code ec;
  fs::create_directories(paths.socket, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("state_dir: cannot create ", paths.socket, ": ", ec.message()));
  }
  if (geteuid() == 0) {
    // The server's user must be able to reach its directory through the state directory.
    for (fs::path p = fs::path(paths.root).parent_path(); !p.empty() && p != p.root_path();
         p = p.parent_path()) {
      struct stat st {};
      if (stat(p.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
        chmod(p.c_str(), st.st_mode | S_IXOTH);
      }
    }
    if (absl::Status s = ChownTree(paths.root, uid, gid); !s.ok()) return s;
  }
  chmod(paths.root.c_str(), 0700);

  const std::string initdb = absl::StrCat(options.bin_dir, "/initdb");
  const std::string pg_ctl = absl::StrCat(options.bin_dir, "/pg_ctl");
  if (!fs::exists(paths.data + "/PG_VERSION")) {
    fs::remove_all(paths.data, ec);  // a half-made data dir from an interrupted initdb
    absl::StatusOr<int> rc = RunAs({initdb, "-D", paths.data, "-U", "dispatchd", "--auth=trust",
                                    "-E", "UTF8", "--no-instructions"},
                                   uid, gid, paths.log);
    if (!rc.ok()) return rc.status();
    if (*rc != 0) {
      return absl::InternalError(absl::StrCat("embedded postgres: initdb failed (exit ", *rc,
                                              "); log ", paths.log, ":\n", Tail(paths.log)));
    }
  }

  // Adopt a server a killed daemon left running; otherwise start one.
  absl::StatusOr<int> running = RunAs({pg_ctl, "-D", paths.data, "status"}, uid, gid, "/dev/null");
  if (!running.ok()) return running.status();
  if (*running != 0) {
    std::string server_opts = absl::StrCat("-c listen_addresses='' -c unix_socket_directories='",
                                           paths.socket, "' -c max_connections=100");
    absl::StatusOr<int> rc = RunAs(
        {pg_ctl, "-D", paths.data, "-l", paths.log, "-w", "-t",
         absl::StrCat(absl::ToInt64Seconds(options.start_timeout)), "-o", server_opts, "start"},
        uid, gid, paths.log);
    if (!rc.ok()) return rc.status();
    if (*rc != 0) {
      return absl::UnavailableError(absl::StrCat("embedded postgres: server did not start (exit ",
                                                 *rc, "); log ", paths.log, ":\n",
                                                 Tail(paths.log)));
    }
  }

  const std::string admin_url =
      absl::StrCat("postgresql:///postgres?host=", paths.socket, "&user=dispatchd");
  try {
    pqxx::connection conn(admin_url);
    pqxx::nontransaction tx(conn);
    pqxx::result r =
        tx.exec_params("SELECT 1 FROM pg_database WHERE datname = $1", options.database);
    if (r.empty()) tx.exec(absl::StrCat("CREATE DATABASE ", tx.quote_name(options.database)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("embedded postgres: cannot prepare database: ", e.what()));
  }
  std::string url =
      absl::StrCat("postgresql:///", options.database, "?host=", paths.socket, "&user=dispatchd");
  return std::unique_ptr<EmbeddedPostgres>(new EmbeddedPostgres(options, std::move(url), uid, gid));
}

EmbeddedPostgres::~EmbeddedPostgres() {
  const Paths paths = PathsFor(options_.state_dir);
  RunAs({absl::StrCat(options_.bin_dir, "/pg_ctl"), "-D", paths.data, "-m", "fast", "-w", "stop"},
        uid_, gid_, paths.log)
      .IgnoreError();  // best effort on shutdown: the next start adopts or recovers the server
}

}  // namespace dispatchd::server
