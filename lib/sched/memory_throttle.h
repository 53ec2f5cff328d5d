#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/config/config.h"

namespace dispatchd::sched {

// A worker's memory as its heartbeat reports it. Totals of 0 mean "not reported".
struct MemoryUse {
  int64_t ram_used_bytes = 0;
  int64_t ram_total_bytes = 0;
  struct Gpu {
    int64_t used_bytes = 0;
    int64_t total_bytes = 0;
  };
  std::vector<Gpu> gpus;
};

// Whether a worker is memory-throttled after this report, with hysteresis: it becomes throttled
// when RAM use reaches `ram_percent` of total or any GPU's use reaches `gpu_percent`, and stays
// throttled until RAM is below `ram_resume_percent` and every GPU below `gpu_resume_percent`.
// `why` (if not null) gets a line for the log, e.g. "RAM at 93.1% (throttle 90%)".
bool NextThrottleState(bool throttled, const MemoryUse& use,
                       const config::MemoryThrottleConfig& limits, std::string* why);

}  // namespace dispatchd::sched
