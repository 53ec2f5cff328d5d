#include "server/console/console.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/client_context.h"
#include <httplib.h>

#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"
#include "server/console/assets.h"

namespace dispatchd::console {
namespace {

// Bound on each call the API makes to the daemon.
constexpr absl::Duration kCallDeadline = absl::Seconds(10);

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Only fails for a message that cannot be printed (an Any of an unknown type): none here.
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "null";
  return out;
}

void Reply(httplib::Response& res, int status, const std::string& json) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(json, "application/json; charset=utf-8");
}

// The HTTP status for a gRPC status code.
int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

// "OK", "NOT_FOUND", ...: gRPC's names of its codes.
std::string CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "UNKNOWN";
}

// The field an error message names: the daemon's messages lead with it ("limit: must be ...").
std::string FieldOf(absl::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return "";
  const absl::string_view head = message.substr(0, colon);
  for (char c : head) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_' && c != '.' && c != '[' &&
        c != ']') {
      return "";
    }
  }
  return std::string(head);
}

void ReplyError(httplib::Response& res, grpc::StatusCode code, const std::string& message,
                std::string field = "") {
  if (field.empty()) field = FieldOf(message);
  google::protobuf::Struct error;
  auto& fields = *error.mutable_fields();
  fields["code"].set_string_value(CodeName(code));
  fields["message"].set_string_value(message);
  fields["field"].set_string_value(field);
  google::protobuf::Struct body;
  *(*body.mutable_fields())["error"].mutable_struct_value() = std::move(error);
  if (code == grpc::StatusCode::UNAUTHENTICATED) {
    res.set_header("WWW-Authenticate", "Bearer realm=\"dispatchd\"");
  }
  Reply(res, HttpStatusOf(code), ToJson(body));
}

// A context for one call on behalf of `req`: its bearer token, and a deadline.
std::unique_ptr<grpc::ClientContext> ContextFor(const httplib::Request& req) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(kCallDeadline));
  if (req.has_header("Authorization")) {
    ctx->AddMetadata("authorization", req.get_header_value("Authorization"));
  }
  return ctx;
}

// Answers `res` with `response` as JSON, or with the call's error.
void ReplyCall(httplib::Response& res, const grpc::Status& status,
               const google::protobuf::Message& response) {
  if (!status.ok()) return ReplyError(res, status.error_code(), status.error_message());
  Reply(res, 200, ToJson(response));
}

// Reads an optional query parameter as a time: RFC 3339 ("2026-01-02T15:04:05Z") or seconds
// since the Unix epoch.
std::optional<absl::Time> ParseTimeParam(const std::string& text) {
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &err)) return t;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && seconds >= 0 && seconds < 1e11) {
    return absl::FromUnixMicros(static_cast<int64_t>(seconds * 1e6));
  }
  return std::nullopt;
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t micros = absl::ToUnixMicros(t);
  *out = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(micros);
}

// The ListJobs request of GET /api/v1/jobs, or an error naming the query parameter.
grpc::Status ListRequestOf(const httplib::Request& req, v1::ListJobsRequest* out,
                           std::string* field) {
  for (const auto& [name, value] : req.params) {
    if (name == "state") {
      std::string upper = absl::AsciiStrToUpper(value);
      if (!absl::StartsWith(upper, "JOB_STATE_")) upper = absl::StrCat("JOB_STATE_", upper);
      v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
      if (!value.empty() &&
          (!v1::JobState_Parse(upper, &state) || state == v1::JOB_STATE_UNSPECIFIED)) {
        *field = name;
        return {grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("state: unknown state \"", value,
                             "\" (queued, dispatched, running, succeeded, failed, cancelled, "
                             "expired)")};
      }
      out->set_state(state);
    } else if (name == "type") {
      out->set_type(value);
    } else if (name == "key") {
      out->set_fairness_key(value);
    } else if (name == "since" || name == "until") {
      if (value.empty()) continue;
      std::optional<absl::Time> t = ParseTimeParam(value);
      if (!t.has_value()) {
        *field = name;
        return {grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat(name,
                             ": want an RFC 3339 time (2026-01-02T15:04:05Z) or seconds "
                             "since the epoch, got \"",
                             value, "\"")};
      }
      SetTimestamp(*t,
                   name == "since" ? out->mutable_created_after() : out->mutable_created_before());
    } else if (name == "limit") {
      int limit = 0;
      if (!absl::SimpleAtoi(value, &limit)) {
        *field = name;
        return {grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("limit: want a whole number, got \"", value, "\"")};
      }
      out->set_limit(limit);
    } else {
      *field = name;
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat(name, ": unknown parameter (state, type, key, since, until, limit)")};
    }
  }
  return grpc::Status::OK;
}

// One line of a job's timeline.
struct TimelineEvent {
  const char* event;
  google::protobuf::Timestamp at;
  std::string detail;
};

// A job's life in time order: created, each attempt (dispatched, started, and for an earlier one
// how it ended), finished.
std::vector<TimelineEvent> TimelineOf(const v1::Job& job) {
  std::vector<TimelineEvent> out;
  out.push_back({"created", job.created_at(), absl::StrCat("queued as type ", job.spec().type())});
  if (job.spec().has_not_before()) {
    out.push_back({"not_before", job.spec().not_before(), "held until this time"});
  }
  const std::string of = absl::StrCat(" of ", job.max_attempts());
  for (const v1::JobAttempt& a : job.earlier_attempts()) {
    const std::string attempt = absl::StrCat("attempt ", a.attempt(), of);
    if (a.has_dispatched_at()) {
      out.push_back(
          {"dispatched", a.dispatched_at(), absl::StrCat(attempt, " to worker ", a.worker_id())});
    }
    if (a.has_started_at()) {
      out.push_back(
          {"started", a.started_at(), absl::StrCat(attempt, " on worker ", a.worker_id())});
    }
    out.push_back({"retried", a.ended_at(),
                   absl::StrCat(attempt, " failed: ", a.error(), "; back in the queue")});
  }
  // The row keeps the times of its latest attempt. Once that attempt ended and the job waits for
  // the next one, they are the last earlier attempt's, shown above.
  const bool latest_ended =
      job.earlier_attempts_size() > 0 &&
      google::protobuf::util::TimeUtil::TimestampToMicroseconds(
          job.earlier_attempts(job.earlier_attempts_size() - 1).dispatched_at()) ==
          google::protobuf::util::TimeUtil::TimestampToMicroseconds(job.dispatched_at());
  if (job.has_dispatched_at() && !latest_ended) {
    // `attempt` counts the attempts accepted: one offered and not accepted is the next.
    const bool accepted = job.has_started_at() || job.state() == v1::JOB_STATE_SUCCEEDED ||
                          job.state() == v1::JOB_STATE_FAILED;
    out.push_back({"dispatched", job.dispatched_at(),
                   absl::StrCat("attempt ", job.attempt() + (accepted ? 0 : 1), of, " to worker ",
                                job.worker_id())});
    if (job.has_started_at()) {
      out.push_back({"started", job.started_at(),
                     absl::StrCat("attempt ", job.attempt(), of, " on worker ", job.worker_id())});
    }
  }
  if (job.has_finished_at()) {
    const absl::string_view state = absl::StripPrefix(v1::JobState_Name(job.state()), "JOB_STATE_");
    out.push_back(
        {"finished", job.finished_at(),
         job.error().empty() ? std::string(state) : absl::StrCat(state, ": ", job.error())});
  }
  std::stable_sort(out.begin(), out.end(), [](const TimelineEvent& a, const TimelineEvent& b) {
    return google::protobuf::util::TimeUtil::TimestampToMicroseconds(a.at) <
           google::protobuf::util::TimeUtil::TimestampToMicroseconds(b.at);
  });
  return out;
}

// What a job's page shows of it: the job (without payload and result, whose sizes it gives) and
// its timeline.
std::string JobPage(v1::Job job) {
  const size_t payload_bytes = job.spec().payload().size();
  const size_t result_bytes = job.result().size();
  job.mutable_spec()->clear_payload();
  job.clear_result();
  google::protobuf::ListValue timeline;
  for (const TimelineEvent& e : TimelineOf(job)) {
    google::protobuf::Struct* line = timeline.add_values()->mutable_struct_value();
    (*line->mutable_fields())["event"].set_string_value(e.event);
    (*line->mutable_fields())["at"].set_string_value(
        google::protobuf::util::TimeUtil::ToString(e.at));
    (*line->mutable_fields())["detail"].set_string_value(e.detail);
  }
  return absl::StrCat("{\"job\":", ToJson(job), ",\"payload_bytes\":", payload_bytes,
                      ",\"result_bytes\":", result_bytes, ",\"timeline\":", ToJson(timeline), "}");
}

std::string ContentTypeOf(absl::string_view name) {
  if (absl::EndsWith(name, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(name, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(name, ".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

void Mount(httplib::Server& http, const std::shared_ptr<grpc::Channel>& channel) {
  std::shared_ptr<v1::JobService::Stub> jobs = v1::JobService::NewStub(channel);
  std::shared_ptr<v1::AdminService::Stub> admin = v1::AdminService::NewStub(channel);

  // The page.
  http.Get("/",
           [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/console/"); });
  http.Get("/console",
           [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/console/"); });
  http.Get(R"(/console/([a-z.]*))", [](const httplib::Request& req, httplib::Response& res) {
    std::string name = req.matches[1].str();
    if (name.empty()) name = "index.html";
    for (const Asset& asset : Assets()) {
      if (asset.name != name) continue;
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("X-Frame-Options", "DENY");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; frame-ancestors 'none'; base-uri 'none'");
      res.set_content(std::string(asset.data), ContentTypeOf(name).c_str());
      return;
    }
    ReplyError(res, grpc::StatusCode::NOT_FOUND, absl::StrCat("no console file \"", name, "\""));
  });

  // The API.
  http.Get("/api/v1/queues", [admin](const httplib::Request& req, httplib::Response& res) {
    v1::StatsResponse resp;
    ReplyCall(res, admin->Stats(ContextFor(req).get(), v1::StatsRequest(), &resp), resp);
  });
  http.Get("/api/v1/workers", [admin](const httplib::Request& req, httplib::Response& res) {
    v1::ListWorkersResponse resp;
    ReplyCall(res, admin->ListWorkers(ContextFor(req).get(), v1::ListWorkersRequest(), &resp),
              resp);
  });
  http.Post(R"(/api/v1/workers/(.+)/drain)",
            [admin](const httplib::Request& req, httplib::Response& res) {
              v1::DrainWorkerRequest request;
              request.set_worker_id(req.matches[1].str());
              v1::DrainWorkerResponse resp;
              ReplyCall(res, admin->DrainWorker(ContextFor(req).get(), request, &resp), resp);
            });
  http.Get("/api/v1/jobs", [jobs](const httplib::Request& req, httplib::Response& res) {
    v1::ListJobsRequest request;
    std::string field;
    if (grpc::Status s = ListRequestOf(req, &request, &field); !s.ok()) {
      return ReplyError(res, s.error_code(), s.error_message(), field);
    }
    v1::ListJobsResponse resp;
    ReplyCall(res, jobs->ListJobs(ContextFor(req).get(), request, &resp), resp);
  });
  http.Get(R"(/api/v1/jobs/([^/]+))", [jobs](const httplib::Request& req, httplib::Response& res) {
    v1::StatusRequest request;
    request.set_job_id(req.matches[1].str());
    v1::StatusResponse resp;
    grpc::Status status = jobs->Status(ContextFor(req).get(), request, &resp);
    if (!status.ok()) return ReplyError(res, status.error_code(), status.error_message());
    Reply(res, 200, JobPage(resp.job()));
  });
  http.Post(R"(/api/v1/jobs/([^/]+)/cancel)",
            [jobs](const httplib::Request& req, httplib::Response& res) {
              v1::CancelRequest request;
              request.set_job_id(req.matches[1].str());
              v1::CancelResponse resp;
              grpc::Status status = jobs->Cancel(ContextFor(req).get(), request, &resp);
              if (!status.ok()) return ReplyError(res, status.error_code(), status.error_message());
              Reply(res, 200, JobPage(resp.job()));
            });
  // Anything else under the API: a JSON 404, not the page.
  auto no_endpoint = [](const httplib::Request& req, httplib::Response& res) {
    ReplyError(res, grpc::StatusCode::NOT_FOUND,
               absl::StrCat("path: no API endpoint ", req.method, " ", req.path));
  };
  http.Get(R"(/api/.*)", no_endpoint);
  http.Post(R"(/api/.*)", no_endpoint);
}

}  // namespace dispatchd::console
