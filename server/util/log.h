#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

// Debian's abseil has its own string_view type; let fmt (and so spdlog) print it.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

namespace dispatchd::server {

// Named per-component loggers ("main", "dispatch", "grpc", "store", "pg") sharing one stderr
// sink. Messages use fmt arguments and key=value fields:
//   Log("dispatch")->info("dispatched job={} worker={}", id, worker);
// Thread-safe.
std::shared_ptr<spdlog::logger> Log(absl::string_view component);

// Sets the level of every component logger; `level` is trace, debug, info, warn or error.
void SetLogLevel(absl::string_view level);

}  // namespace dispatchd::server
