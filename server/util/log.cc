#include "server/util/log.h"

#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace dispatchd::server {
namespace {

spdlog::sink_ptr Sink() {
  static spdlog::sink_ptr* sink = [] {
    auto* s = new spdlog::sink_ptr(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    (*s)->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n: %v");
    return s;
  }();
  return *sink;
}

}  // namespace

std::shared_ptr<spdlog::logger> Log(absl::string_view component) {
  std::string name(component);
  if (auto existing = spdlog::get(name)) return existing;
  // Get-or-create must be one step: spdlog::register_logger throws when another thread has
  // registered the name since the get above, and a throw out of a gRPC handler reaches the
  // client as UNIMPLEMENTED.
  static absl::Mutex* mu = new absl::Mutex();
  absl::MutexLock l(mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = std::make_shared<spdlog::logger>(name, Sink());
  logger->set_level(spdlog::default_logger()->level());
  logger->flush_on(spdlog::level::info);
  spdlog::register_logger(logger);
  return logger;
}

void SetLogLevel(absl::string_view level) {
  spdlog::level::level_enum l = spdlog::level::from_str(std::string(level));
  spdlog::default_logger()->set_level(l);
  spdlog::set_level(l);
}

}  // namespace dispatchd::server
