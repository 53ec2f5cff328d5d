#pragma once

#include "absl/strings/string_view.h"

namespace dispatchd::server {

// Names the calling thread, as `top -H`, `ps -L`, `perf` and /proc/PID/task/TID/comm show it, so
// that an operator (or `bench.py profile`) can tell the daemon's threads apart. Linux keeps the
// first 15 bytes. A failure is ignored: the name only helps the eye.
void SetThreadName(absl::string_view name);

}  // namespace dispatchd::server
