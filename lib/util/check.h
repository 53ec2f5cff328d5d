#pragma once

// Always-on invariant checks. A broken internal invariant aborts loudly; request data and the
// environment are never CHECKed (they become a Status). The installed abseil has no absl/log.

#include <cstdio>
#include <cstdlib>

#define DISPATCHD_CHECK(cond, msg)                                                           \
  do {                                                                                       \
    if (!(cond)) [[unlikely]] {                                                              \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, msg); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (false)
