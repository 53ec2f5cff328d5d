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
    // In use on the whole device, by every process (the worker's own included).
    int64_t used_bytes = 0;
    int64_t total_bytes = 0;
    // Of `used_bytes`, what the worker's own processes hold; -1 when it does not say.
    int64_t worker_bytes = -1;
  };
  std::vector<Gpu> gpus;
};

// Whether a worker is memory-throttled after this report, with hysteresis: it becomes throttled
// when RAM use reaches `ram_percent` of total or any GPU's use reaches `gpu_percent`, and stays
// throttled until RAM is below `ram_resume_percent` and every GPU below `gpu_resume_percent`.
// A GPU's use is what other processes hold (`used_bytes - worker_bytes`) when the worker says what
// it holds itself, else all of `used_bytes`: a worker that preallocates the GPU (vLLM) is then not
// held back by its own allocation, which no job's end would ever give back.
// `why` (if not null) gets a line for the log, e.g. "RAM at 93.1% (throttle 90%)".
bool NextThrottleState(bool throttled, const MemoryUse& use,
                       const config::MemoryThrottleConfig& limits, std::string* why);

}  // namespace dispatchd::sched
