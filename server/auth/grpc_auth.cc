#include "server/auth/grpc_auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/evp.h"
#include <sys/stat.h>

#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"

namespace dispatchd::auth {
namespace {

constexpr absl::string_view kAuthorizationKey = "authorization";

absl::StatusOr<std::string> ReadTokensFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("auth.tokens_file: cannot read ", path, ": ", std::strerror(errno)));
  }
  // Digests are not tokens, but a readable list still tells who the principals are, and a
  // writable one lets anyone become an admin.
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "auth.tokens_file: %s has mode %04o; other users may read or change it: chmod 0600 (or "
        "0640 for a group that only reads it)",
        path, st.st_mode & 07777));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("auth.tokens_file: cannot open ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TokenDigest DigestOf(absl::string_view token) {
  TokenDigest digest{};
  unsigned int size = 0;
  EVP_Digest(token.data(), token.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

absl::StatusOr<std::shared_ptr<const Identities>> Identities::Load(
    const config::AuthConfig& config) {
  auto out = std::make_shared<Identities>();
  if (!config.tokens_file.empty()) {
    absl::StatusOr<std::string> text = ReadTokensFile(config.tokens_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<TokenTable> table = TokenTable::Parse(*text, config.tokens_file);
    if (!table.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth.tokens_file: ", table.status().message()));
    }
    out->tokens = *std::move(table);
  }
  for (const config::CertificatePrincipal& c : config.certificates) {
    out->certificates.emplace(c.name,
                              Principal{.name = c.principal, .role = c.role, .types = c.types});
  }
  return std::shared_ptr<const Identities>(std::move(out));
}

void Gate::Set(std::shared_ptr<const Identities> identities) {
  absl::MutexLock l(&mu_);
  identities_ = std::move(identities);
}

absl::StatusOr<Principal> Gate::Resolve(const grpc::ServerContextBase& ctx,
                                        std::string* reason) const {
  std::shared_ptr<const Identities> ids;
  {
    absl::MutexLock l(&mu_);
    ids = identities_;
  }
  const std::multimap<grpc::string_ref, grpc::string_ref>& metadata = ctx.client_metadata();
  auto header = metadata.find(grpc::string_ref(kAuthorizationKey.data(), kAuthorizationKey.size()));
  if (header != metadata.end()) {
    absl::string_view value(header->second.data(), header->second.size());
    if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
      *reason = "malformed";
      return absl::UnauthenticatedError("the authorization metadata must read `Bearer <token>`");
    }
    const absl::string_view token = absl::StripAsciiWhitespace(value.substr(7));
    const Principal* p = token.empty() ? nullptr : ids->tokens.Find(DigestOf(token));
    if (p == nullptr) {
      *reason = "bad_token";
      return absl::UnauthenticatedError("the bearer token is not known (revoked or mistyped)");
    }
    return *p;
  }
  // No token: the names of the connection's client certificate, which gRPC sets only once the
  // certificate has verified against tls.client_ca_file.
  bool presented = false;
  if (std::shared_ptr<const grpc::AuthContext> context = ctx.auth_context()) {
    for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
      for (const grpc::string_ref& name : context->FindPropertyValues(property)) {
        presented = true;
        auto it = ids->certificates.find(absl::string_view(name.data(), name.size()));
        if (it != ids->certificates.end()) return it->second;
      }
    }
  }
  *reason = presented ? "unknown_certificate" : "no_credentials";
  return absl::UnauthenticatedError(
      presented ? "the client certificate names no principal in auth.certificates"
                : "no credentials: send `authorization: Bearer <token>` or a client certificate");
}

absl::StatusOr<Principal> Gate::Authorize(const grpc::ServerContextBase& ctx, Method method) const {
  Principal caller = Principal::Local();
  if (enabled_) {
    std::string reason;
    absl::StatusOr<Principal> resolved = Resolve(ctx, &reason);
    if (!resolved.ok()) {
      metrics::Metrics().auth_refusals.With({reason}).Inc();
      server::Log("auth")->warn("refused method={} peer={} reason={}", ToString(method), ctx.peer(),
                                reason);
      return absl::UnauthenticatedError(
          absl::StrCat(ToString(method), ": ", resolved.status().message()));
    }
    caller = *std::move(resolved);
  }
  if (absl::Status s = auth::Authorize(caller, method); !s.ok()) {
    metrics::Metrics().auth_refusals.With({"role"}).Inc();
    server::Log("auth")->warn("refused method={} peer={} principal={} role={} reason=role",
                              ToString(method), ctx.peer(), caller.name, ToString(caller.role));
    return s;
  }
  return caller;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const config::Config& config) {
  const config::TlsConfig& tls = config.tls;
  if (tls.enabled()) {
    const unsigned refresh = static_cast<unsigned>(absl::ToInt64Seconds(tls.refresh_interval));
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
        tls.client_ca_file.empty()
            ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  tls.key_file, tls.cert_file, refresh)
            : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  tls.key_file, tls.cert_file, tls.client_ca_file, refresh);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    if (!tls.client_ca_file.empty()) options.watch_root_certs();
    switch (tls.client_auth) {
      case config::ClientAuth::kNone:
        options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
        break;
      case config::ClientAuth::kRequest:
        options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
        break;
      case config::ClientAuth::kRequire:
        options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
        break;
    }
    return grpc::experimental::TlsServerCredentials(options);
  }
  if (config.auth.enabled()) return grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  return grpc::InsecureServerCredentials();
}

}  // namespace dispatchd::auth
