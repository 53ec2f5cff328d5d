#pragma once

// The services take their requests as raw bytes and parse them here, so that every call reaches
// a handler. gRPC's generated callback handlers parse a typed request themselves and, when that
// fails (a body that is not protobuf, or a string field that is not UTF-8), answer UNIMPLEMENTED
// with an empty message without calling the method, as they do when the method throws. A raw
// method instead answers INVALID_ARGUMENT naming the problem, and INTERNAL for an exception.

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

#include "server/util/grpc_status.h"

namespace dispatchd::rpc {

// Parses `raw` into `message`: OK, or INVALID_ARGUMENT naming the first string field that is not
// valid UTF-8 (`spec.type: not valid UTF-8 ...`) or else saying the body is not a `message`.
absl::Status ParseRequest(const grpc::ByteBuffer* raw, google::protobuf::Message* message);

// Serializes `message` into `raw`, replacing what it held.
void SerializeTo(const google::protobuf::Message& message, grpc::ByteBuffer* raw);

// One unary call of a raw method: owns the typed request and response, and writes the response
// into gRPC's buffer when it finishes OK. Deletes itself when gRPC is done with it.
template <typename Request, typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryCall(grpc::ByteBuffer* raw_response) : raw_response_(raw_response) {}

  Request& request() { return request_; }
  Response& response() { return response_; }

  // Finishes the call; on OK, with the response.
  void Reply(const grpc::Status& status) {
    if (status.ok()) SerializeTo(response_, raw_response_);
    Finish(status);
  }
  void Reply(const absl::Status& status) { Reply(server::ToGrpcStatus(status)); }

  void OnDone() override { delete this; }

 private:
  Request request_;
  Response response_;
  grpc::ByteBuffer* const raw_response_;
};

// Starts one unary call: a UnaryCall holding the parsed request, or, when the request does not
// parse, already answered INVALID_ARGUMENT (and then `*parsed` is false).
template <typename Request, typename Response>
UnaryCall<Request, Response>* StartUnary(const grpc::ByteBuffer* raw_request,
                                         grpc::ByteBuffer* raw_response, bool* parsed) {
  auto* call = new UnaryCall<Request, Response>(raw_response);
  absl::Status status = ParseRequest(raw_request, &call->request());
  *parsed = status.ok();
  if (!*parsed) call->Reply(status);
  return call;
}

// Serves one unary call: parses the request and runs `handle(call)`, which finishes the call
// with call->Reply, now or later. A request that does not parse is answered INVALID_ARGUMENT
// without running `handle`; an exception out of `handle` is answered INTERNAL.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* ServeUnary(const grpc::ByteBuffer* raw_request,
                                     grpc::ByteBuffer* raw_response, Handle&& handle) {
  auto* call = new UnaryCall<Request, Response>(raw_response);
  if (absl::Status parsed = ParseRequest(raw_request, &call->request()); !parsed.ok()) {
    call->Reply(parsed);
    return call;
  }
  try {
    std::forward<Handle>(handle)(call);
  } catch (const std::exception& e) {
    call->Reply(
        grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("internal error: ", e.what())));
  }
  return call;
}

}  // namespace dispatchd::rpc
