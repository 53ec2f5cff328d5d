#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

#include "server/metrics/registry.h"

namespace httplib {
class Server;
}

namespace dispatchd::metrics {

// Serves `registry` over HTTP for Prometheus: GET /metrics (text exposition 0.0.4) on its own
// thread, and whatever `routes` adds (the web console); every other path is 404.
//
//   absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start("127.0.0.1:9464", registry);
//   (*s)->address();  // "127.0.0.1:9464"; with port 0, the port the system chose
class HttpServer {
 public:
  // Adds handlers to the server before it listens; they run on its worker threads.
  using Routes = std::function<void(httplib::Server&)>;

  // InvalidArgument for a malformed host:port, Unavailable if it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Registry& registry,
                                                           const Routes& routes = nullptr);
  // Stop().
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // host:port it listens on.
  const std::string& address() const { return address_; }
  // Stops listening and joins the thread. Idempotent.
  void Stop();

 private:
  HttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string address_;
};

}  // namespace dispatchd::metrics
