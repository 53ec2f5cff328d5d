#pragma once

// What the benchmarks' command-line tools (dispatch-loadgen, dispatch-fleet) share in main().

#include <cstdio>
#include <string>

#include <sys/resource.h>

namespace dispatchd::bench {

// Prints "PROGRAM: MESSAGE" and a pointer to --help on stderr; returns the usage exit status, 2.
inline int UsageError(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", program, message.c_str());
  return 2;
}

// User and system CPU seconds of this process so far.
inline double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace dispatchd::bench
