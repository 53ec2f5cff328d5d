#pragma once

// The worker SDK's logger, shared by its .cc files (worker.cc, worker_session.cc,
// worker_handler_pool.cc, worker_memory_probe.cc). Nothing else includes it.

#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace dispatchd::client::worker_internal {

// The logger named "worker": the application's, if it registered one under that name before the
// first use, else one on stderr. Thread-safe; created once, on first use.
inline std::shared_ptr<spdlog::logger> Log() {
  static const std::shared_ptr<spdlog::logger> log = [] {
    std::shared_ptr<spdlog::logger> existing = spdlog::get("worker");
    return existing != nullptr ? existing : spdlog::stderr_color_mt("worker");
  }();
  return log;
}

}  // namespace dispatchd::client::worker_internal
