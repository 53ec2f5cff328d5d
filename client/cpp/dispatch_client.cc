#include "client/cpp/dispatch_client.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include <arpa/inet.h>

namespace dispatchd::client {
namespace {

// Longest deadline we hand gRPC: far enough to mean "no limit", near enough not to overflow.
constexpr absl::Duration kMaxDeadline = absl::Hours(24 * 365);

}  // namespace

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext* context) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  std::string message = status.error_message();
  std::string retry_after;
  if (code == absl::StatusCode::kResourceExhausted && context != nullptr) {
    const auto& trailers = context->GetServerTrailingMetadata();
    auto it = trailers.find("retry-after-ms");
    if (it != trailers.end()) {
      retry_after.assign(it->second.data(), it->second.size());
      int64_t ms = 0;
      if (absl::SimpleAtoi(retry_after, &ms) && ms >= 0) {
        absl::StrAppend(&message, " (retry after ", ms, "ms)");
      } else {
        retry_after.clear();
      }
    }
  }
  absl::Status out(code, message);
  if (!retry_after.empty()) out.SetPayload(kRetryAfterPayloadUrl, absl::Cord(retry_after));
  return out;
}

absl::StatusOr<std::string> ChannelTarget(absl::string_view address) {
  if (address.empty()) return absl::InvalidArgumentError("address: empty");
  if (!absl::StrContains(address, ',')) return std::string(address);
  // Several daemons of one database: gRPC's pick_first over a static list tries them in order and
  // moves on when one is unreachable. Such a list takes numeric addresses only.
  std::vector<std::string> parts;
  for (absl::string_view a : absl::StrSplit(address, ',')) {
    a = absl::StripAsciiWhitespace(a);
    const size_t colon = a.rfind(':');
    std::string host(a.substr(0, colon == absl::string_view::npos ? 0 : colon));
    in_addr v4;
    if (colon == absl::string_view::npos || inet_pton(AF_INET, host.c_str(), &v4) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "address: in a list of daemons each must be a numeric IPv4 host:port, got \"", a, "\""));
    }
    parts.emplace_back(a);
  }
  return absl::StrCat("ipv4:", absl::StrJoin(parts, ","));
}

grpc::ChannelArguments DaemonChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // results are bounded by the daemon, not by gRPC's 4 MiB
  return args;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(absl::string_view address,
                                                        ClientOptions options) {
  absl::StatusOr<std::string> target = ChannelTarget(address);
  if (!target.ok()) return target.status();
  if (options.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_deadline: must be positive");
  }
  absl::StatusOr<Credentials> credentials = LoadCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(*target, credentials->channel, DaemonChannelArguments());
  return FromChannel(std::move(channel), std::move(options), std::move(credentials->token));
}

std::unique_ptr<Client> Client::FromChannel(std::shared_ptr<grpc::Channel> channel,
                                            ClientOptions options, std::string token) {
  return std::unique_ptr<Client>(
      new Client(std::move(channel), std::move(options), std::move(token)));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string token)
    : options_(std::move(options)),
      token_(std::move(token)),
      channel_(std::move(channel)),
      jobs_(v1::JobService::NewStub(channel_)),
      admin_(v1::AdminService::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

void Client::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  if (timeout > kMaxDeadline) timeout = kMaxDeadline;
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token_.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

absl::StatusOr<v1::SubmitResponse> Client::Submit(const v1::JobSpec& spec) {
  v1::SubmitRequest request;
  *request.mutable_spec() = spec;
  return Unary(&v1::JobService::Stub::Submit, *jobs_, request, options_.default_deadline);
}

absl::StatusOr<v1::SubmitBatchResponse> Client::SubmitBatch(const std::vector<v1::JobSpec>& specs) {
  v1::SubmitBatchRequest request;
  request.mutable_specs()->Reserve(static_cast<int>(specs.size()));
  for (const v1::JobSpec& spec : specs) *request.add_specs() = spec;
  return Unary(&v1::JobService::Stub::SubmitBatch, *jobs_, request, options_.default_deadline);
}

absl::StatusOr<v1::Job> Client::RunSync(const v1::JobSpec& spec, absl::Duration wait) {
  v1::RunSyncRequest request;
  *request.mutable_spec() = spec;
  absl::StatusOr<v1::RunSyncResponse> r =
      Unary(&v1::JobService::Stub::RunSync, *jobs_, request, wait);
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_job());
}

absl::StatusOr<v1::Job> Client::Status(absl::string_view job_id) {
  v1::StatusRequest request;
  request.set_job_id(std::string(job_id));
  absl::StatusOr<v1::StatusResponse> r =
      Unary(&v1::JobService::Stub::Status, *jobs_, request, options_.default_deadline);
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_job());
}

absl::StatusOr<v1::Job> Client::Cancel(absl::string_view job_id) {
  v1::CancelRequest request;
  request.set_job_id(std::string(job_id));
  absl::StatusOr<v1::CancelResponse> r =
      Unary(&v1::JobService::Stub::Cancel, *jobs_, request, options_.default_deadline);
  if (!r.ok()) return r.status();
  return std::move(*r->mutable_job());
}

absl::Status Client::Watch(absl::string_view job_id,
                           const std::function<void(const v1::Job&)>& on_event,
                           absl::Duration wait) {
  grpc::ClientContext context;
  Prepare(context, wait);
  v1::WatchRequest request;
  request.set_job_id(std::string(job_id));
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = jobs_->Watch(&context, request);
  v1::WatchEvent event;
  while (reader->Read(&event)) on_event(event.job());
  return FromGrpcStatus(reader->Finish(), &context);
}

absl::StatusOr<v1::StatsResponse> Client::Stats() {
  return Unary(&v1::AdminService::Stub::Stats, *admin_, v1::StatsRequest(),
               options_.default_deadline);
}

absl::StatusOr<v1::DrainWorkerResponse> Client::DrainWorker(absl::string_view worker_id) {
  v1::DrainWorkerRequest request;
  request.set_worker_id(std::string(worker_id));
  return Unary(&v1::AdminService::Stub::DrainWorker, *admin_, request, options_.default_deadline);
}

absl::StatusOr<v1::ReloadResponse> Client::Reload() {
  return Unary(&v1::AdminService::Stub::Reload, *admin_, v1::ReloadRequest(),
               options_.default_deadline);
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(
    absl::string_view service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> r =
      Unary(&grpc::health::v1::Health::Stub::Check, *health_, request, options_.default_deadline);
  if (!r.ok()) return r.status();
  return r->status();
}

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers() {
  return Unary(&v1::AdminService::Stub::ListWorkers, *admin_, v1::ListWorkersRequest(),
               options_.default_deadline);
}

absl::StatusOr<v1::SetRateLimitResponse> Client::SetRateLimit(
    const v1::SetRateLimitRequest& request) {
  return Unary(&v1::AdminService::Stub::SetRateLimit, *admin_, request, options_.default_deadline);
}

absl::StatusOr<v1::SetTenantWeightResponse> Client::SetTenantWeight(
    const v1::SetTenantWeightRequest& request) {
  return Unary(&v1::AdminService::Stub::SetTenantWeight, *admin_, request,
               options_.default_deadline);
}

}  // namespace dispatchd::client
