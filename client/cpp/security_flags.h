#pragma once

#include "CLI/CLI.hpp"

#include "client/cpp/credentials.h"

namespace dispatchd::client {

// The TLS and token flags every tool takes, with their environment variables (see Security).
inline void AddSecurityFlags(CLI::App& app, Security* security) {
  app.add_option("--tls-ca", security->tls_ca,
                 "PEM file of the CA that signed the daemon's certificate; set: connect with TLS")
      ->envname("DISPATCHD_TLS_CA");
  app.add_option("--tls-cert", security->tls_cert,
                 "PEM file of this client's certificate, for mutual TLS (with --tls-key)")
      ->envname("DISPATCHD_TLS_CERT");
  app.add_option("--tls-key", security->tls_key, "PEM file of the private key of --tls-cert")
      ->envname("DISPATCHD_TLS_KEY");
  app.add_option("--token-file", security->token_file,
                 "File whose first line is the bearer token to present")
      ->envname("DISPATCHD_TOKEN_FILE");
}

}  // namespace dispatchd::client
