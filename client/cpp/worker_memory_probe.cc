#include "client/cpp/worker_memory_probe.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include "client/cpp/worker_log.h"

namespace dispatchd::client::worker_internal {
namespace {

// Host RAM (used, total) in bytes from /proc/meminfo; zeros where it cannot be read.
std::pair<int64_t, int64_t> ReadMemInfo() {
  std::ifstream in("/proc/meminfo");
  int64_t total_kb = 0, available_kb = -1;
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:") total_kb = value;
    if (key == "MemAvailable:") available_kb = value;
  }
  if (total_kb <= 0 || available_kb < 0) return {0, std::max<int64_t>(total_kb, 0) * 1024};
  return {(total_kb - available_kb) * 1024, total_kb * 1024};
}

void SetGpu(const GpuReading& r, v1::Gpu* gpu) {
  gpu->set_id(absl::StrCat(r.index));
  gpu->set_name(r.name);
  gpu->set_uuid(r.uuid);
  gpu->set_memory_total_bytes(r.memory_total_bytes);
  gpu->set_memory_used_bytes(r.memory_used_bytes);
  if (r.memory_used_by_worker_bytes.has_value()) {
    gpu->set_memory_used_by_worker_bytes(*r.memory_used_by_worker_bytes);
  }
}

}  // namespace

std::unique_ptr<GpuSource> GpuSource::Create(const WorkerOptions& options) {
  std::shared_ptr<spdlog::logger> log = Log();
  if (!options.gpus.empty() || !options.nvml) {
    return std::unique_ptr<GpuSource>(new GpuSource(options.gpus, nullptr, {}));
  }
  const std::string library = NvmlReader::DefaultLibrary();
  absl::StatusOr<std::unique_ptr<NvmlReader>> nvml = NvmlReader::Open(library);
  std::vector<GpuReading> gpus;
  if (nvml.ok()) {
    absl::StatusOr<std::vector<GpuReading>> read = (*nvml)->Read();
    if (read.ok()) {
      gpus = *std::move(read);
    } else {
      nvml = read.status();
    }
  }
  if (!nvml.ok()) {
    log->info("no GPU readings worker={}: {}", options.worker_id,
              std::string(nvml.status().message()));
    return std::unique_ptr<GpuSource>(new GpuSource({}, nullptr, {}));
  }
  std::vector<std::string> listed;
  for (const GpuReading& g : gpus) {
    listed.push_back(absl::StrFormat("%d %s %s %.1fGB", g.index, g.name, g.uuid,
                                     static_cast<double>(g.memory_total_bytes) / 1e9));
  }
  log->info("GPUs from NVML worker={} count={}: {}", options.worker_id, gpus.size(),
            absl::StrJoin(listed, "; "));
  return std::unique_ptr<GpuSource>(new GpuSource({}, *std::move(nvml), std::move(gpus)));
}

GpuSource::GpuSource(std::vector<WorkerOptions::Gpu> configured, std::unique_ptr<NvmlReader> nvml,
                     std::vector<GpuReading> first)
    : configured_(std::move(configured)), nvml_(std::move(nvml)), nvml_gpus_(std::move(first)) {}

void GpuSource::Add(google::protobuf::RepeatedPtrField<v1::Gpu>* gpus) {
  for (const WorkerOptions::Gpu& g : configured_) {
    v1::Gpu* gpu = gpus->Add();
    gpu->set_id(g.id);
    gpu->set_memory_total_bytes(g.memory_total_bytes);
  }
  if (nvml_ == nullptr) return;
  absl::StatusOr<std::vector<GpuReading>> now = nvml_->Read();
  absl::MutexLock l(&mu_);
  if (!now.ok() && !failing_) {
    Log()->warn("GPU readings failed: {} (reporting no GPU memory in use until they work)",
                std::string(now.status().message()));
  }
  failing_ = !now.ok();
  // The GPUs of the first reading, each with its reading now if there is one (matched by
  // index): the daemon expects the same GPUs in every heartbeat.
  for (const GpuReading& first : nvml_gpus_) {
    GpuReading reading = first;
    reading.memory_used_bytes = 0;
    reading.memory_used_by_worker_bytes.reset();
    if (now.ok()) {
      for (const GpuReading& r : *now) {
        if (r.index == first.index) reading = r;
      }
    }
    SetGpu(reading, gpus->Add());
  }
}

void AddMemoryReadings(const std::function<WorkerOptions::MemoryReport()>& probe,
                       v1::Heartbeat* heartbeat) {
  if (probe) {
    WorkerOptions::MemoryReport report = probe();
    heartbeat->set_ram_used_bytes(report.ram_used_bytes);
    heartbeat->set_ram_total_bytes(report.ram_total_bytes);
    for (int i = 0;
         i < heartbeat->gpus_size() && i < static_cast<int>(report.gpu_used_bytes.size()); ++i) {
      heartbeat->mutable_gpus(i)->set_memory_used_bytes(report.gpu_used_bytes[i]);
      heartbeat->mutable_gpus(i)->clear_memory_used_by_worker_bytes();
    }
  } else {
    auto [used, total] = ReadMemInfo();
    heartbeat->set_ram_used_bytes(used);
    heartbeat->set_ram_total_bytes(total);
  }
}

}  // namespace dispatchd::client::worker_internal
