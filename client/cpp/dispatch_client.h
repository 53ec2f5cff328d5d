#pragma once

// C++ client for dispatchd's JobService and AdminService.
//
//   absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect("127.0.0.1:7411");
//   absl::StatusOr<v1::SubmitResponse> r = (*client)->Submit(spec);
//
// Every call carries a deadline (ClientOptions::default_deadline unless the method takes a wait).
// gRPC statuses map 1:1 onto absl::Status codes; a RESOURCE_EXHAUSTED refusal that carries the
// daemon's `retry-after-ms` trailer gets it in the message and as a payload (see RetryAfter()).
//
// Thread-safe: one Client may be shared by any number of threads.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include <grpcpp/grpcpp.h>

#include "client/cpp/credentials.h"
#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"

namespace dispatchd::client {

namespace v1 = ::dispatchd::v1;

struct ClientOptions {
  // Deadline of each unary call (Submit, Status, Cancel, Stats, ListWorkers, SetRateLimit,
  // SetTenantWeight).
  absl::Duration default_deadline = absl::Seconds(10);
  // TLS and the bearer token (see Security); none by default.
  Security security;
};

// Type URL of the absl::Status payload that carries `retry-after-ms` (the value is the decimal
// number of milliseconds, as the daemon sent it).
inline constexpr absl::string_view kRetryAfterPayloadUrl = "dispatchd.dev/retry-after-ms";

// The daemon's retry-after hint carried by `status`, if any.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

// Converts a finished call's gRPC status to an absl::Status with the same code and message, adding
// the `retry-after-ms` trailer (if `context` has one) to RESOURCE_EXHAUSTED refusals.
absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext* context);

// The gRPC target for `address`: itself, or "ipv4:a,b,..." for a list (see Client::Connect).
absl::StatusOr<std::string> ChannelTarget(absl::string_view address);

// Channel arguments for a channel to dispatchd: no gRPC limit on the size of received messages
// (the daemon bounds them).
grpc::ChannelArguments DaemonChannelArguments();

class Client {
 public:
  // Opens a channel, with the TLS and token of `options.security`, to `address` (host:port) or
  // to a comma-separated list of numeric IPv4 host:port of daemons sharing one database (any of
  // them serves clients: calls go to the first that answers). The connection is made lazily by
  // the first call; a daemon that cannot be reached shows up as UNAVAILABLE or DEADLINE_EXCEEDED
  // there. INVALID_ARGUMENT if `address` is empty or a malformed list, a deadline in `options` is
  // not positive, or a file that `options.security` names cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(absl::string_view address,
                                                         ClientOptions options = {});
  // As Connect, on an existing channel (tests, custom credentials); each call carries `token`
  // (none if empty).
  static std::unique_ptr<Client> FromChannel(std::shared_ptr<grpc::Channel> channel,
                                             ClientOptions options = {}, std::string token = "");

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Queues a job; returns its id (or the existing one's, marked deduplicated).
  absl::StatusOr<v1::SubmitResponse> Submit(const v1::JobSpec& spec);
  // Queues many jobs at once, all or none; one answer per spec, in order. A bad spec fails the
  // whole call with INVALID_ARGUMENT naming it (`specs[3].type: ...`).
  absl::StatusOr<v1::SubmitBatchResponse> SubmitBatch(const std::vector<v1::JobSpec>& specs);
  // Queues a job and waits up to `wait` for it to end; returns the final job whatever its outcome
  // (inspect `state`). DEADLINE_EXCEEDED when `wait` passes first (the job keeps going).
  absl::StatusOr<v1::Job> RunSync(const v1::JobSpec& spec, absl::Duration wait);
  // Reads one job; NOT_FOUND if unknown.
  absl::StatusOr<v1::Job> Status(absl::string_view job_id);
  // Cancels a job; returns it after the cancellation. FAILED_PRECONDITION if it already ended.
  absl::StatusOr<v1::Job> Cancel(absl::string_view job_id);
  // Streams the job's state changes to `on_event` (called on this thread, first with the state when
  // the watch began) until the daemon ends the stream after the terminal state (OK), or `wait`
  // passes (DEADLINE_EXCEEDED), or the call fails.
  absl::Status Watch(absl::string_view job_id, const std::function<void(const v1::Job&)>& on_event,
                     absl::Duration wait = absl::Hours(24));
  // Job counts by type and state, worker totals, and the scheduler's queues per tier, type,
  // model and fairness key.
  absl::StatusOr<v1::StatsResponse> Stats();
  // Connected workers.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // Changes or clears a model's rate limit until the daemon's next config load. INVALID_ARGUMENT
  // for a bad request, NOT_FOUND if no configured type uses the model.
  absl::StatusOr<v1::SetRateLimitResponse> SetRateLimit(const v1::SetRateLimitRequest& request);
  absl::StatusOr<v1::SetTenantWeightResponse> SetTenantWeight(
      const v1::SetTenantWeightRequest& request);
  // Drains a connected worker (no new jobs; it finishes what it runs, then stops). NOT_FOUND if
  // no such worker is connected.
  absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(absl::string_view worker_id);
  // Makes the daemon re-read its config file (as SIGHUP does). FAILED_PRECONDITION, naming the
  // problem, if the file is refused; the running config then stays in force.
  absl::StatusOr<v1::ReloadResponse> Reload();
  // The daemon's standard gRPC health status (grpc.health.v1.Health/Check) for `service` ("" for
  // the whole daemon, or e.g. "dispatchd.v1.JobService"). SERVING while the daemon reaches its
  // database and, if it leads, its dispatcher runs; NOT_FOUND for a service it does not know.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      absl::string_view service = "");

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string token);
  // Prepares `context` for a call: the deadline now + `timeout`, and the token.
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;
  // One unary call of `stub` with a deadline `timeout` from now: its response, or its status
  // (FromGrpcStatus, so a refusal keeps its retry-after).
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                                 Stub& stub, const Request& request, absl::Duration timeout) const {
    grpc::ClientContext context;
    Prepare(context, timeout);
    Response response;
    grpc::Status status = (stub.*method)(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status, &context);
    return response;
  }

  const ClientOptions options_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace dispatchd::client
