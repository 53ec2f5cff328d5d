#include "server/metrics/http_server.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include <httplib.h>

#include "server/util/thread_name.h"

namespace dispatchd::metrics {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Registry& registry,
                                                              const Routes& routes) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.listen: want host:port, got \"", listen, "\""));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (routes) routes(*s->server_);
  if (port == 0) {
    port = s->server_->bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!s->server_->bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("metrics.listen: cannot bind ", listen));
  }
  s->address_ = absl::StrCat(listen.substr(0, colon), ":", port);
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] {
    server::SetThreadName("metrics-http");
    server->listen_after_bind();
  });
  return s;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dispatchd::metrics
