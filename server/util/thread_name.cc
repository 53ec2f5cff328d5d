#include "server/util/thread_name.h"

#include <algorithm>
#include <array>

#include <pthread.h>

namespace dispatchd::server {

void SetThreadName(absl::string_view name) {
  std::array<char, 16> buf{};  // 15 bytes and the terminating NUL
  const size_t n = std::min(name.size(), buf.size() - 1);
  std::copy_n(name.data(), n, buf.data());
  pthread_setname_np(pthread_self(), buf.data());
}

}  // namespace dispatchd::server
