#pragma once

// The GPUs and memory readings the worker SDK's Hello and heartbeats carry (the daemon places
// models by the GPUs' memory, and stops sending jobs to a worker whose use passes its throttle
// thresholds). Internal to the SDK (worker.h).

#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "client/cpp/nvml_reader.h"
#include "client/cpp/worker.h"
#include "dispatchd/v1/worker_service.pb.h"

namespace dispatchd::client::worker_internal {

// The GPUs a worker reports: WorkerOptions::gpus when it lists any, else those NVML reads (when
// WorkerOptions::nvml), else none.
//
//   std::unique_ptr<GpuSource> gpus = GpuSource::Create(options);
//   gpus->Add(hello.mutable_gpus());
//
// Thread-safe.
class GpuSource {
 public:
  // Opens NVML if the options leave the GPUs to it, and logs one line saying what it found or
  // why there are no readings.
  static std::unique_ptr<GpuSource> Create(const WorkerOptions& options);

  // Appends the worker's GPUs with their memory now: read afresh from NVML each call, or the
  // configured totals (and no use).
  void Add(google::protobuf::RepeatedPtrField<v1::Gpu>* gpus) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  GpuSource(std::vector<WorkerOptions::Gpu> configured, std::unique_ptr<NvmlReader> nvml,
            std::vector<GpuReading> first);

  const std::vector<WorkerOptions::Gpu> configured_;
  const std::unique_ptr<NvmlReader> nvml_;  // null unless the GPUs come from NVML
  // The GPUs NVML reported first: Hello and heartbeats report these, in this order.
  const std::vector<GpuReading> nvml_gpus_;
  absl::Mutex mu_;
  // The last NVML read failed (logged once until one succeeds again).
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
};

// Sets the RAM in use and in total of `heartbeat`, and the memory in use of each GPU it already
// lists (in the order of its GPUs), from `probe` if it is set, else host RAM from /proc/meminfo
// (zeros where that cannot be read) and the GPU use already filled in. A GPU whose use the probe
// sets loses its `memory_used_by_worker_bytes`: the probe's figure counts whole.
//
//   AddMemoryReadings(options.memory_probe, message.mutable_heartbeat());
//
// Thread-compatible; the worker calls it on a session's timer thread, which is where `probe`
// then runs.
void AddMemoryReadings(const std::function<WorkerOptions::MemoryReport()>& probe,
                       v1::Heartbeat* heartbeat);

}  // namespace dispatchd::client::worker_internal
