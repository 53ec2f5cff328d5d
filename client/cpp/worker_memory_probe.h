#pragma once

// The memory readings the worker SDK's heartbeats carry (the daemon stops sending jobs to a worker
// whose use passes its throttle thresholds). Internal to the SDK (worker.h).

#include <functional>

#include "client/cpp/worker.h"
#include "dispatchd/v1/worker_service.pb.h"

namespace dispatchd::client::worker_internal {

// Sets the RAM in use and in total of `heartbeat`, and the memory in use of each GPU it already
// lists (in the order of WorkerOptions::gpus): from `probe` if it is set, else host RAM from
// /proc/meminfo (zeros where that cannot be read) and no GPU use.
//
//   AddMemoryReadings(options.memory_probe, message.mutable_heartbeat());
//
// Thread-compatible; the worker calls it on a session's timer thread, which is where `probe`
// then runs.
void AddMemoryReadings(const std::function<WorkerOptions::MemoryReport()>& probe,
                       v1::Heartbeat* heartbeat);

}  // namespace dispatchd::client::worker_internal
