#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

#include "lib/auth/principal.h"
#include "lib/auth/token_file.h"
#include "lib/config/config.h"

namespace dispatchd::auth {

// SHA-256 of `token`.
TokenDigest DigestOf(absl::string_view token);

// The principals the daemon knows, as of the last start or reload: the tokens file and the
// certificate names of `auth:`. Immutable.
struct Identities {
  TokenTable tokens;
  // Certificate common name or subject alternative name -> principal.
  absl::flat_hash_map<std::string, Principal> certificates;

  // Reads `config.tokens_file` (refused if other users may read it or others may write it).
  static absl::StatusOr<std::shared_ptr<const Identities>> Load(const config::AuthConfig& config);
};

// Who calls, and whether it may: the one check every handler makes first. It resolves the caller
// of each call in one place, from the bearer token of the call's `authorization` metadata, or
// else from the verified client certificate of its connection, and checks the role against the
// method. Handlers get the principal and never read metadata themselves.
//
// Why not a grpc::AuthMetadataProcessor: gRPC hands the processor the connection's AuthContext,
// shared by every call on it, so a property it records for one call is seen by the next (a
// revoked token would go on working on an open connection). Here nothing is kept between calls.
// Thread-safe.
class Gate {
 public:
  // `identities` null: no authentication is configured, and every caller is Principal::Local().
  explicit Gate(std::shared_ptr<const Identities> identities)
      : enabled_(identities != nullptr), identities_(std::move(identities)) {}

  // Replaces the principals (reload); the next call sees them. Streams already open keep the
  // principal they were opened with.
  void Set(std::shared_ptr<const Identities> identities) ABSL_LOCKS_EXCLUDED(mu_);

  // The caller of `ctx`, if it may call `method`: UNAUTHENTICATED if it presented no valid
  // credentials, PERMISSION_DENIED naming the method if its role may not. Each refusal is
  // counted in dispatchd_auth_refusals_total and logged, without secrets.
  absl::StatusOr<Principal> Authorize(const grpc::ServerContextBase& ctx, Method method) const
      ABSL_LOCKS_EXCLUDED(mu_);

  bool enabled() const { return enabled_; }

 private:
  // The principal of `ctx`, or the reason it has none (a dispatchd_auth_refusals_total reason).
  absl::StatusOr<Principal> Resolve(const grpc::ServerContextBase& ctx, std::string* reason) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const bool enabled_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Identities> identities_ ABSL_GUARDED_BY(mu_);
};

// The listener's credentials for `config`: TLS (optionally mutual) when `tls.cert_file` is set;
// else gRPC's local credentials, which admit loopback peers only, when `auth` is configured; else
// none (plaintext).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const config::Config& config);

}  // namespace dispatchd::auth
