#include "client/cpp/credentials.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dispatchd::client {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

Security Security::FromEnvironment() {
  return Security{.tls_ca = Env("DISPATCHD_TLS_CA"),
                  .tls_cert = Env("DISPATCHD_TLS_CERT"),
                  .tls_key = Env("DISPATCHD_TLS_KEY"),
                  .token_file = Env("DISPATCHD_TOKEN_FILE")};
}

void Credentials::Apply(grpc::ClientContext& context) const {
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

absl::StatusOr<Credentials> LoadCredentials(const Security& security) {
  Credentials out;
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (security.tls_ca.empty() && !security.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls-cert: needs --tls-ca (the daemon's CA)");
  }
  if (security.tls_ca.empty()) {
    out.channel = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile(security.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!security.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(security.tls_cert, "--tls-cert");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(security.tls_key, "--tls-key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    out.channel = grpc::SslCredentials(ssl);
  }
  if (!security.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(security.token_file, "--token-file");
    if (!text.ok()) return text.status();
    std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file: ", security.token_file, " holds no token"));
    }
    out.token = std::move(token);
  }
  return out;
}

}  // namespace dispatchd::client
