// libFuzzer target: a client's Submit request, as bytes off the wire, through the checks the
// daemon runs before it writes a row (JobServiceImpl::Admit in server/rpc/job_service.cc):
// parse as dispatchd.v1.SubmitRequest, convert::FromProto, then sched::ResolveSpec against a
// fixed config. Hostile input must give a Status, never a crash, a leak or undefined behaviour;
// and a spec that passes must hold what the rest of the daemon relies on (checked below).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/common.h"

#include "dispatchd/v1/job_service.pb.h"
#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/admission.h"
#include "lib/util/check.h"
#include "server/config/yaml_config.h"
#include "server/convert/job_proto.h"

namespace {

using ::dispatchd::config::Config;

// A small payload limit so that the fuzzer reaches the oversized-payload refusal; a type with
// defaults, one with a model and tier, one with its own attempts and timeout.
constexpr char kConfig[] = R"(
max_payload_bytes: 4096
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
  for (const std::string* key : {&spec.resource_id, &spec.fairness_key, &spec.idempotency_key}) {
    DISPATCHD_CHECK(key->size() <= 256 && PrintableAscii(*key), "admitted a bad key");
  }
  DISPATCHD_CHECK(spec.labels.size() <= 32, "admitted more than 32 labels");
  for (const auto& [key, value] : spec.labels) {
    DISPATCHD_CHECK(!key.empty() && key.size() <= 128 && PrintableAscii(key) &&
                        key.find_first_of("=, ") == std::string::npos,
                    "admitted a bad label key");
    DISPATCHD_CHECK(value.size() <= 128 && PrintableAscii(value), "admitted a bad label value");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs each string field with invalid UTF-8; the parse result is what counts.
  google::protobuf::SetLogHandler(nullptr);
  FuzzConfig();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dispatchd::v1::SubmitRequest request;
  // gRPC refuses a request that does not parse before the handler runs.
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  const Config& config = FuzzConfig();
  absl::StatusOr<dispatchd::job::JobSpec> spec = dispatchd::convert::FromProto(request.spec());
  if (spec.ok()) {
    if (spec->fairness_key.empty()) spec->fairness_key = kPeer;
    spec = dispatchd::sched::ResolveSpec(config, *std::move(spec));
  }
  if (!spec.ok()) {
    DISPATCHD_CHECK(absl::IsInvalidArgument(spec.status()),
                    "a refusal that is not INVALID_ARGUMENT");
    return 0;
  }
  CheckAdmitted(config, *spec);

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
  return 0;
}
