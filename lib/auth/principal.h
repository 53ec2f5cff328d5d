#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dispatchd::auth {

// What a caller may do; see Authorize.
enum class Role {
  // JobService on its own jobs; its jobs are queued under its own name.
  kClient,
  // WorkerService only, for the job types its entry allows.
  kWorker,
  // Everything, AdminService included, on every job.
  kAdmin,
  // A trusted front door: JobService on its own jobs, and it may name the end user it acts for in
  // `fairness_key`.
  kGateway,
};

// "client", "worker", "admin", "gateway": the spelling of tokens files, config and logs.
absl::string_view ToString(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Who is calling, as resolved once per call from a bearer token or a client certificate.
struct Principal {
  // Unique among principals; owns the jobs it submits. Empty only for Local().
  std::string name;
  Role role = Role::kClient;
  // For a worker: the job types it may serve. Empty: every type.
  std::vector<std::string> types;
  // False only for Local().
  bool authenticated = true;

  // The caller of a daemon that has no authentication configured (it then serves loopback only,
  // unless told `insecure: true`): an admin with no name, which owns nothing and may do anything.
  static Principal Local();
};

// Every RPC the daemon authorizes, named as gRPC names it in errors and logs.
enum class Method {
  kSubmit,
  kSubmitBatch,
  kRunSync,
  kStatus,
  kCancel,
  kWatch,
  kListJobs,
  kConnect,
  kStats,
  kListWorkers,
  kSetRateLimit,
  kDrainWorker,
  kReload,
  kSetTenantWeight,
};

// "dispatchd.v1.JobService/Submit", ...
absl::string_view ToString(Method method);

// OK if `caller`'s role may call `method`; else PermissionDenied naming the method and the role.
absl::Status Authorize(const Principal& caller, Method method);

// True if `caller` may read, watch or cancel a job submitted by `owner`: its own jobs, or any job
// for an admin. A job it may not see is reported NOT_FOUND, so ids leak nothing.
bool MaySee(const Principal& caller, absl::string_view owner);

// The fairness key a job of `caller` is queued under when it asks for `requested` (empty: none).
// A gateway (or an admin) chooses it, its own name when empty. A client's jobs always queue under
// its own name, whatever it asks for, so that inventing keys cannot buy it more shares; a client
// that serves end users of its own is what the gateway role is for. Local() keeps `requested`,
// empty included (the caller's address stands in later).
std::string FairnessKeyFor(const Principal& caller, absl::string_view requested);

// OK if `caller` may serve every type in `types`; else PermissionDenied naming the first that
// its entry does not allow.
absl::Status MayServe(const Principal& caller, const std::vector<std::string>& types);

}  // namespace dispatchd::auth
