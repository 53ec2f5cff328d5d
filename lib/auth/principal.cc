#include "lib/auth/principal.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dispatchd::auth {
namespace {

enum class Api { kJob, kWorker, kAdmin };

Api ApiOf(Method method) {
  switch (method) {
    case Method::kSubmit:
    case Method::kSubmitBatch:
    case Method::kRunSync:
    case Method::kStatus:
    case Method::kCancel:
    case Method::kWatch:
    case Method::kListJobs:
      return Api::kJob;
    case Method::kConnect:
      return Api::kWorker;
    case Method::kStats:
    case Method::kListWorkers:
    case Method::kSetRateLimit:
    case Method::kDrainWorker:
    case Method::kReload:
    case Method::kSetTenantWeight:
      return Api::kAdmin;
  }
  return Api::kAdmin;
}

}  // namespace

absl::string_view ToString(Role role) {
  switch (role) {
    case Role::kClient:
      return "client";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kGateway:
      return "gateway";
  }
  return "client";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kClient, Role::kWorker, Role::kAdmin, Role::kGateway}) {
    if (name == ToString(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role \"", name, "\"; one of client, worker, admin, gateway"));
}

Principal Principal::Local() {
  return Principal{.name = "", .role = Role::kAdmin, .types = {}, .authenticated = false};
}

absl::string_view ToString(Method method) {
  switch (method) {
    case Method::kSubmit:
      return "dispatchd.v1.JobService/Submit";
    case Method::kSubmitBatch:
      return "dispatchd.v1.JobService/SubmitBatch";
    case Method::kRunSync:
      return "dispatchd.v1.JobService/RunSync";
    case Method::kStatus:
      return "dispatchd.v1.JobService/Status";
    case Method::kCancel:
      return "dispatchd.v1.JobService/Cancel";
    case Method::kWatch:
      return "dispatchd.v1.JobService/Watch";
    case Method::kListJobs:
      return "dispatchd.v1.JobService/ListJobs";
    case Method::kConnect:
      return "dispatchd.v1.WorkerService/Connect";
    case Method::kStats:
      return "dispatchd.v1.AdminService/Stats";
    case Method::kListWorkers:
      return "dispatchd.v1.AdminService/ListWorkers";
    case Method::kSetRateLimit:
      return "dispatchd.v1.AdminService/SetRateLimit";
    case Method::kDrainWorker:
      return "dispatchd.v1.AdminService/DrainWorker";
    case Method::kReload:
      return "dispatchd.v1.AdminService/Reload";
    case Method::kSetTenantWeight:
      return "dispatchd.v1.AdminService/SetTenantWeight";
  }
  return "unknown method";
}

absl::Status Authorize(const Principal& caller, Method method) {
  bool allowed = false;
  switch (ApiOf(method)) {
    case Api::kJob:
      allowed = caller.role == Role::kClient || caller.role == Role::kGateway ||
                caller.role == Role::kAdmin;
      break;
    case Api::kWorker:
      allowed = caller.role == Role::kWorker || caller.role == Role::kAdmin;
      break;
    case Api::kAdmin:
      allowed = caller.role == Role::kAdmin;
      break;
  }
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(ToString(method), ": principal \"", caller.name,
                                                  "\" has role ", ToString(caller.role),
                                                  ", which may not call it"));
}

bool MaySee(const Principal& caller, absl::string_view owner) {
  return caller.role == Role::kAdmin || caller.name == owner;
}

std::string FairnessKeyFor(const Principal& caller, absl::string_view requested) {
  if (!caller.authenticated) return std::string(requested);
  if (caller.role == Role::kClient || requested.empty()) return caller.name;
  return std::string(requested);
}

absl::Status MayServe(const Principal& caller, const std::vector<std::string>& types) {
  if (caller.types.empty()) return absl::OkStatus();
  for (const std::string& type : types) {
    if (std::find(caller.types.begin(), caller.types.end(), type) == caller.types.end()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "hello.types: worker principal \"", caller.name, "\" may not serve type \"", type, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace dispatchd::auth
