#include "client/cpp/worker_memory_probe.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

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

}  // namespace

void AddMemoryReadings(const std::function<WorkerOptions::MemoryReport()>& probe,
                       v1::Heartbeat* heartbeat) {
  if (probe) {
    WorkerOptions::MemoryReport report = probe();
    heartbeat->set_ram_used_bytes(report.ram_used_bytes);
    heartbeat->set_ram_total_bytes(report.ram_total_bytes);
    for (int i = 0;
         i < heartbeat->gpus_size() && i < static_cast<int>(report.gpu_used_bytes.size()); ++i) {
      heartbeat->mutable_gpus(i)->set_memory_used_bytes(report.gpu_used_bytes[i]);
    }
  } else {
    auto [used, total] = ReadMemInfo();
    heartbeat->set_ram_used_bytes(used);
    heartbeat->set_ram_total_bytes(total);
  }
}

}  // namespace dispatchd::client::worker_internal
