// A stand-in for libnvidia-ml.so.1: answers the NVML calls the worker SDKs make (C++
// client/cpp/nvml_reader.cc, Python client/python/dispatchd/nvml.py) with what the file named by
// the environment's NVML_STANDIN_FILE says, read afresh at every call so that a test can change
// it while a worker runs. Tests point DISPATCHD_NVML_LIBRARY at it.
//
// The file, one item a line ('#' starts a comment):
//
//   gpu TOTAL USED UUID NAME...     a device (in index order), memory in bytes
//   proc GPU PID BYTES              a compute process on device GPU; PID "self" is the caller
//   fail init                       nvmlInit_v2 fails (NVML_ERROR_DRIVER_NOT_LOADED)
//   fail memory                     nvmlDeviceGetMemoryInfo fails (NVML_ERROR_GPU_IS_LOST)
//   fail processes                  the process list is not supported (NVML_ERROR_NOT_SUPPORTED)
//
// No NVML_STANDIN_FILE, or a file that cannot be read: nvmlInit_v2 fails, as on a host without a
// driver.

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "client/cpp/nvml_abi.h"

namespace {

using dispatchd::nvml_abi::kErrorDriverNotLoaded;
using dispatchd::nvml_abi::kErrorGpuIsLost;
using dispatchd::nvml_abi::kErrorInsufficientSize;
using dispatchd::nvml_abi::kErrorInvalidArgument;
using dispatchd::nvml_abi::kErrorNotSupported;
using dispatchd::nvml_abi::kErrorUninitialized;
using dispatchd::nvml_abi::kSuccess;

struct Device {
  unsigned long long total = 0;
  unsigned long long used = 0;
  std::string uuid;
  std::string name;
};

struct Process {
  unsigned gpu = 0;
  unsigned pid = 0;
  unsigned long long bytes = 0;
};

struct State {
  bool readable = false;
  std::vector<Device> devices;
  std::vector<Process> processes;
  std::set<std::string> failures;
};

State Load() {
  State s;
  const char* path = std::getenv("NVML_STANDIN_FILE");
  if (path == nullptr) return s;
  std::ifstream in(path);
  if (!in) return s;
  s.readable = true;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind;
    if (!(words >> kind) || kind[0] == '#') continue;
    if (kind == "gpu") {
      Device d;
      words >> d.total >> d.used >> d.uuid;
      std::getline(words >> std::ws, d.name);
      s.devices.push_back(d);
    } else if (kind == "proc") {
      Process p;
      std::string pid;
      words >> p.gpu >> pid >> p.bytes;
      p.pid = pid == "self" ? static_cast<unsigned>(getpid())
                            : static_cast<unsigned>(std::strtoul(pid.c_str(), nullptr, 10));
      s.processes.push_back(p);
    } else if (kind == "fail") {
      std::string what;
      words >> what;
      s.failures.insert(what);
    }
  }
  return s;
}

// Device handles are pointers into this array; the index is the offset.
struct DeviceSlot {
  char unused;
};
DeviceSlot g_slots[64];
int g_initialized = 0;

// The device index of `handle`, or -1 if it names none the file lists.
int IndexOf(const void* handle, const State& s) {
  const auto* slot = static_cast<const DeviceSlot*>(handle);
  if (slot < g_slots || slot >= g_slots + 64) return -1;
  const int i = static_cast<int>(slot - g_slots);
  return i < static_cast<int>(s.devices.size()) ? i : -1;
}

void CopyOut(const std::string& text, char* out, unsigned length) {
  std::strncpy(out, text.c_str(), length);
  if (length > 0) out[length - 1] = '\0';
}

}  // namespace

// Each function has the type client/cpp/nvml_abi.h gives it, which the reader calls it through.
namespace nvml = dispatchd::nvml_abi;

extern "C" {

__attribute__((visibility("default"))) nvml::Return nvmlInit_v2() {
  State s = Load();
  if (!s.readable || s.failures.count("init") > 0) return kErrorDriverNotLoaded;
  ++g_initialized;
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlShutdown() {
  if (g_initialized == 0) return kErrorUninitialized;
  --g_initialized;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(nvml::Return result) {
  switch (result) {
    case kSuccess:
      return "Success";
    case kErrorUninitialized:
      return "Uninitialized";
    case kErrorNotSupported:
      return "Not Supported";
    case kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    case kErrorGpuIsLost:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetCount_v2(unsigned* count) {
  if (g_initialized == 0) return kErrorUninitialized;
  *count = static_cast<unsigned>(Load().devices.size());
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetHandleByIndex_v2(
    unsigned index, nvml::Device* device) {
  if (g_initialized == 0) return kErrorUninitialized;
  if (index >= Load().devices.size() || index >= 64) return kErrorInvalidArgument;
  *device = reinterpret_cast<nvml::Device>(&g_slots[index]);
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetMemoryInfo(nvml::Device device,
                                                                            nvml::Memory* memory) {
  if (g_initialized == 0) return kErrorUninitialized;
  State s = Load();
  const int i = IndexOf(device, s);
  if (i < 0) return kErrorInvalidArgument;
  if (s.failures.count("memory") > 0) return kErrorGpuIsLost;
  const Device& d = s.devices[static_cast<size_t>(i)];
  memory->total = d.total;
  memory->used = d.used;
  memory->free = d.total > d.used ? d.total - d.used : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetName(nvml::Device device,
                                                                      char* name, unsigned length) {
  if (g_initialized == 0) return kErrorUninitialized;
  State s = Load();
  const int i = IndexOf(device, s);
  if (i < 0) return kErrorInvalidArgument;
  CopyOut(s.devices[static_cast<size_t>(i)].name, name, length);
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetUUID(nvml::Device device,
                                                                      char* uuid, unsigned length) {
  if (g_initialized == 0) return kErrorUninitialized;
  State s = Load();
  const int i = IndexOf(device, s);
  if (i < 0) return kErrorInvalidArgument;
  CopyOut(s.devices[static_cast<size_t>(i)].uuid, uuid, length);
  return kSuccess;
}

__attribute__((visibility("default"))) nvml::Return nvmlDeviceGetComputeRunningProcesses_v3(
    nvml::Device device, unsigned* count, nvml::ProcessInfo* infos) {
  if (g_initialized == 0) return kErrorUninitialized;
  State s = Load();
  const int i = IndexOf(device, s);
  if (i < 0 || count == nullptr) return kErrorInvalidArgument;
  if (s.failures.count("processes") > 0) return kErrorNotSupported;
  std::vector<Process> mine;
  for (const Process& p : s.processes) {
    if (p.gpu == static_cast<unsigned>(i)) mine.push_back(p);
  }
  const unsigned room = *count;
  *count = static_cast<unsigned>(mine.size());
  if (room < mine.size() || (infos == nullptr && !mine.empty())) return kErrorInsufficientSize;
  for (size_t p = 0; p < mine.size(); ++p) {
    infos[p] = {mine[p].pid, mine[p].bytes, 0xFFFFFFFF, 0xFFFFFFFF};
  }
  return kSuccess;
}

}  // extern "C"
