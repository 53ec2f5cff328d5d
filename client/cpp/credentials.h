#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace dispatchd::client {

// How a client or worker talks to a daemon that has TLS or authentication on. Every tool takes
// the same flags and environment variables:
//
//   --tls-ca      DISPATCHD_TLS_CA      PEM file of the CA that signed the daemon's certificate;
//                                       set: the channel uses TLS and checks the daemon with it
//   --tls-cert    DISPATCHD_TLS_CERT    PEM file of this client's certificate (mutual TLS)
//   --tls-key     DISPATCHD_TLS_KEY     PEM file of its private key
//   --token-file  DISPATCHD_TOKEN_FILE  file whose first line is the bearer token
//
// All empty (the default): a plaintext channel with no token, which a daemon without
// authentication on loopback accepts.
struct Security {
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;

  // The four environment variables above (unset ones stay empty).
  static Security FromEnvironment();
};

// What a channel and each call carry.
struct Credentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // The bearer token, sent as `authorization: Bearer <token>` metadata on every call (plain
  // metadata rather than call credentials, so that it also reaches a daemon that serves tokens
  // on loopback without TLS). Empty: none.
  std::string token;

  // Adds the token to `context`, if there is one.
  void Apply(grpc::ClientContext& context) const;
};

// Reads the files `security` names. INVALID_ARGUMENT naming the flag for a file that cannot be
// read, an empty token, or a certificate without its key.
absl::StatusOr<Credentials> LoadCredentials(const Security& security);

}  // namespace dispatchd::client
