// libFuzzer target: a client's Submit request, as bytes off the wire, through what the daemon
// runs before it writes a row: rpc::ParseRequest (server/rpc/raw_call.cc, as every method of
// the services parses its request), then JobServiceImpl::Admit's checks (server/rpc/
// job_service.cc): convert::FromProto, the fairness key auth::FairnessKeyFor gives the caller,
// and sched::ResolveSpec against a fixed config. Hostile input must give INVALID_ARGUMENT, never
// a crash, a leak or undefined behaviour; and a spec that passes must hold what the rest of the
// daemon relies on (checked below) for a caller of each kind.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

#include "dispatchd/v1/job_service.pb.h"
#include "lib/auth/principal.h"
#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/admission.h"
#include "lib/util/check.h"
#include "server/config/yaml_config.h"
#include "server/convert/job_proto.h"
#include "server/rpc/raw_call.h"

namespace {

using ::dispatchd::config::Config;

// Small payload and label/key limits so that the fuzzer reaches their refusals; a type with
// defaults, one with a model and tier, one with its own attempts and timeout.
constexpr char kConfig[] = R"(
max_payload_bytes: 4096
limits: {max_labels: 4, max_label_bytes: 16, max_key_bytes: 32}
tiers:
  - {name: interactive, value: 8}
types:
  - name: echo
  - name: llm.generate
    model: llama
    tier: interactive
    vram_gb: 16
    rpm: 60
  - name: embed.text
    max_attempts: 5
    timeout: 90s
    on_orphan: fail
)";

// What PeerIdentity(ctx->peer()) gives Admit for a TCP client.
constexpr char kPeer[] = "ipv4:127.0.0.1";

// A daemon without authentication, a client and a gateway (which may name the fairness key).
const std::vector<dispatchd::auth::Principal>& Callers() {
  static const auto* const callers = new std::vector<dispatchd::auth::Principal>{
      dispatchd::auth::Principal::Local(),
      {.name = "team-a", .role = dispatchd::auth::Role::kClient},
      {.name = "frontend", .role = dispatchd::auth::Role::kGateway},
  };
  return *callers;
}

const Config& FuzzConfig() {
  static const Config* const config = [] {
    absl::StatusOr<Config> c = dispatchd::server::ParseConfig(kConfig, "fuzz_submit_spec.yaml");
    DISPATCHD_CHECK(c.ok(), "the fuzz target's own config does not parse");
    return new Config(*std::move(c));
  }();
  return *config;
}

bool PrintableAscii(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// What the store, the scheduler and the workers assume of every admitted spec.
void CheckAdmitted(const Config& config, const dispatchd::job::JobSpec& spec) {
  const dispatchd::config::JobTypeConfig* type = config.FindType(spec.type);
  DISPATCHD_CHECK(type != nullptr, "admitted an unknown type");
  DISPATCHD_CHECK(!spec.payload.empty(), "admitted an empty payload");
  DISPATCHD_CHECK(static_cast<int64_t>(spec.payload.size()) <= config.max_payload_bytes,
                  "admitted an oversized payload");
  DISPATCHD_CHECK(spec.max_attempts >= 1 && spec.max_attempts <= 100,
                  "admitted max_attempts outside [1, 100]");
  DISPATCHD_CHECK(spec.timeout > absl::ZeroDuration() && spec.timeout <= absl::Hours(24 * 7),
                  "admitted a timeout outside (0, 168h]");
  DISPATCHD_CHECK(spec.dispatch_deadline > absl::ZeroDuration(),
                  "admitted a non-positive dispatch_deadline");
  DISPATCHD_CHECK(!spec.fairness_key.empty(), "admitted an empty fairness key");
  const dispatchd::config::LimitsConfig& limits = config.limits;
  for (const std::string* key : {&spec.resource_id, &spec.fairness_key, &spec.idempotency_key}) {
    DISPATCHD_CHECK(
        key->size() <= static_cast<size_t>(limits.max_key_bytes) && PrintableAscii(*key),
        "admitted a bad key");
  }
  DISPATCHD_CHECK(spec.labels.size() <= static_cast<size_t>(limits.max_labels),
                  "admitted more than limits.max_labels labels");
  const size_t max_label = static_cast<size_t>(limits.max_label_bytes);
  for (const auto& [key, value] : spec.labels) {
    DISPATCHD_CHECK(!key.empty() && key.size() <= max_label && PrintableAscii(key) &&
                        key.find_first_of("=, ") == std::string::npos,
                    "admitted a bad label key");
    DISPATCHD_CHECK(value.size() <= max_label && PrintableAscii(value),
                    "admitted a bad label value");
  }
}

// Admit's checks of one spec for one caller, and what an admitted spec must hold.
void CheckSpec(const dispatchd::v1::JobSpec& wire_spec, const dispatchd::auth::Principal& caller) {
  const Config& config = FuzzConfig();
  absl::StatusOr<dispatchd::job::JobSpec> spec = dispatchd::convert::FromProto(wire_spec);
  if (spec.ok()) {
    spec->fairness_key = dispatchd::auth::FairnessKeyFor(caller, spec->fairness_key);
    if (spec->fairness_key.empty()) spec->fairness_key = kPeer;
    spec = dispatchd::sched::ResolveSpec(config, *std::move(spec));
  }
  if (!spec.ok()) {
    DISPATCHD_CHECK(absl::IsInvalidArgument(spec.status()),
                    "a refusal that is not INVALID_ARGUMENT");
    return;
  }
  CheckAdmitted(config, *spec);
  if (caller.authenticated && caller.role == dispatchd::auth::Role::kClient) {
    DISPATCHD_CHECK(spec->fairness_key == caller.name, "a client chose its own fairness key");
  }

  // The admitted spec goes back on the wire (Status, Watch, RunSync): it must read back the same.
  dispatchd::v1::JobSpec wire;
  dispatchd::convert::ToProto(*spec, &wire);
  absl::StatusOr<dispatchd::job::JobSpec> again = dispatchd::convert::FromProto(wire);
  DISPATCHD_CHECK(again.ok(), "an admitted spec does not convert back from its wire form");
  DISPATCHD_CHECK(again->timeout == spec->timeout, "timeout changed on the wire");
  DISPATCHD_CHECK(again->dispatch_deadline == spec->dispatch_deadline,
                  "dispatch_deadline changed on the wire");
  // Times travel in whole microseconds, as PostgreSQL keeps them.
  DISPATCHD_CHECK(absl::ToUnixMicros(again->not_before) == absl::ToUnixMicros(spec->not_before),
                  "not_before changed on the wire");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs each string field with invalid UTF-8; the parse result is what counts.
  google::protobuf::SetLogHandler(nullptr);
  FuzzConfig();
  Callers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The request as gRPC hands it to the method: a byte buffer.
  grpc::Slice slice(data, size);
  grpc::ByteBuffer raw(&slice, 1);
  dispatchd::v1::SubmitRequest request;
  if (absl::Status parsed = dispatchd::rpc::ParseRequest(&raw, &request); !parsed.ok()) {
    DISPATCHD_CHECK(absl::IsInvalidArgument(parsed),
                    "a request that does not parse is not INVALID_ARGUMENT");
    dispatchd::v1::SubmitRequest direct;
    DISPATCHD_CHECK(!direct.ParseFromArray(data, static_cast<int>(size)),
                    "ParseRequest refused a request protobuf parses");
    return 0;
  }
  for (const dispatchd::auth::Principal& caller : Callers()) CheckSpec(request.spec(), caller);
  return 0;
}
