#pragma once

#include <memory>

#include "grpcpp/channel.h"

namespace httplib {
class Server;
}

namespace dispatchd::console {

// The web console: a page (GET /console/, and / redirects there) and the JSON API it reads,
// under /api/v1/. Each API request is one call of the daemon's own gRPC API over `channel` (an
// in-process channel to the daemon's server), carrying the request's `Authorization: Bearer`
// header as the call's `authorization` metadata: the same gate, roles, validation and code
// serve both, so a client sees only its own jobs here too. The gRPC status becomes the HTTP
// status (see docs/console.md) with a JSON body {"error": {"code", "message", "field"}}.
//
//   console::Mount(http, server->InProcessChannel(grpc::ChannelArguments()));
//
// Thread-safe: handlers run on the HTTP server's threads and share nothing but the channel.
void Mount(httplib::Server& http, const std::shared_ptr<grpc::Channel>& channel);

}  // namespace dispatchd::console
