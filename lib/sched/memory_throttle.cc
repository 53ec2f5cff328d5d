#include "lib/sched/memory_throttle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dispatchd::sched {
namespace {

double Percent(int64_t used, int64_t total) {
  return total > 0 ? 100.0 * static_cast<double>(used) / static_cast<double>(total) : 0;
}

}  // namespace

bool NextThrottleState(bool throttled, const MemoryUse& use,
                       const config::MemoryThrottleConfig& limits, std::string* why) {
  const double ram = Percent(use.ram_used_bytes, use.ram_total_bytes);
  double gpu = 0;
  for (const MemoryUse::Gpu& g : use.gpus) {
    const int64_t counted =
        g.worker_bytes >= 0 ? std::max<int64_t>(g.used_bytes - g.worker_bytes, 0) : g.used_bytes;
    gpu = std::max(gpu, Percent(counted, g.total_bytes));
  }
  const bool ram_high = ram >= (throttled ? limits.ram_resume_percent : limits.ram_percent);
  const bool gpu_high = gpu >= (throttled ? limits.gpu_resume_percent : limits.gpu_percent);
  const bool next = ram_high || gpu_high;
  if (why != nullptr) {
    *why = absl::StrFormat(
        "RAM at %.1f%% (throttle %g%%, resume %g%%), GPU memory at %.1f%% "
        "(throttle %g%%, resume %g%%)",
        ram, limits.ram_percent, limits.ram_resume_percent, gpu, limits.gpu_percent,
        limits.gpu_resume_percent);
  }
  return next;
}

}  // namespace dispatchd::sched
