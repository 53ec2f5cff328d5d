#include "client/cpp/nvml_reader.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include <dlfcn.h>
#include <unistd.h>

#include "client/cpp/nvml_abi.h"

namespace dispatchd::client {
namespace {

using nvml_abi::kErrorInsufficientSize;
using nvml_abi::kNameBufferSize;
using nvml_abi::kSuccess;
using nvml_abi::kUuidBufferSize;
using nvml_abi::kValueNotAvailable;
using NvmlReturn = nvml_abi::Return;
using NvmlDevice = nvml_abi::Device;
using NvmlMemory = nvml_abi::Memory;
using NvmlProcessInfo = nvml_abi::ProcessInfo;

// The parent of `pid` from /proc/PID/stat ("pid (comm) state ppid ..."); 0 if unknown.
pid_t ParentOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 1));
  std::string state;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return rest ? ppid : 0;
}

// Whether `pid` is this process or one of its descendants.
bool IsOwn(pid_t pid) {
  const pid_t self = getpid();
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    if (pid == self) return true;
    pid = ParentOf(pid);
  }
  return false;
}

}  // namespace

struct NvmlReader::Api {
  nvml_abi::InitFn* init;
  nvml_abi::ShutdownFn* shutdown;
  nvml_abi::ErrorStringFn* error_string;
  nvml_abi::GetCountFn* get_count;
  nvml_abi::GetHandleFn* get_handle;
  nvml_abi::GetMemoryFn* get_memory;
  nvml_abi::GetNameFn* get_name;
  nvml_abi::GetUuidFn* get_uuid;
  nvml_abi::GetProcessesFn* get_processes;

  std::string Error(const char* call, NvmlReturn rc) const {
    const char* text = error_string(rc);
    return absl::StrCat(call, ": ", text != nullptr ? text : "unknown error", " (", rc, ")");
  }
};

std::string NvmlReader::DefaultLibrary() {
  const char* env = std::getenv("DISPATCHD_NVML_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1";
}

absl::StatusOr<std::unique_ptr<NvmlReader>> NvmlReader::Open(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(
        absl::StrCat("cannot load ", library, ": ", why != nullptr ? why : "unknown error"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto resolve = [&](auto*& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr && missing.empty()) missing = name;
  };
  resolve(api->init, "nvmlInit_v2");
  resolve(api->shutdown, "nvmlShutdown");
  resolve(api->error_string, "nvmlErrorString");
  resolve(api->get_count, "nvmlDeviceGetCount_v2");
  resolve(api->get_handle, "nvmlDeviceGetHandleByIndex_v2");
  resolve(api->get_memory, "nvmlDeviceGetMemoryInfo");
  resolve(api->get_name, "nvmlDeviceGetName");
  resolve(api->get_uuid, "nvmlDeviceGetUUID");
  resolve(api->get_processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (!missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat(library, " has no ", missing));
  }
  if (NvmlReturn rc = api->init(); rc != kSuccess) {
    std::string why = api->Error("nvmlInit_v2", rc);
    dlclose(handle);
    return absl::UnavailableError(why);
  }
  return std::unique_ptr<NvmlReader>(new NvmlReader(handle, std::move(api)));
}

NvmlReader::NvmlReader(void* handle, std::unique_ptr<Api> api)
    : handle_(handle), api_(std::move(api)) {}

NvmlReader::~NvmlReader() {
  api_->shutdown();
  dlclose(handle_);
}

absl::StatusOr<std::vector<GpuReading>> NvmlReader::Read() const {
  unsigned count = 0;
  if (NvmlReturn rc = api_->get_count(&count); rc != kSuccess) {
    return absl::UnavailableError(api_->Error("nvmlDeviceGetCount_v2", rc));
  }
  std::vector<NvmlDevice> devices(count);
  std::vector<std::string> uuids(count);
  for (unsigned i = 0; i < count; ++i) {
    if (NvmlReturn rc = api_->get_handle(i, &devices[i]); rc != kSuccess) {
      return absl::UnavailableError(api_->Error("nvmlDeviceGetHandleByIndex_v2", rc));
    }
    char uuid[kUuidBufferSize] = {};
    if (api_->get_uuid(devices[i], uuid, sizeof uuid) == kSuccess) uuids[i] = uuid;
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<GpuReading> out;
  for (int i : CudaVisibleIndices(
           visible != nullptr ? std::optional<std::string>(visible) : std::nullopt, uuids)) {
    NvmlDevice device = devices[static_cast<unsigned>(i)];
    GpuReading gpu{.index = i, .uuid = uuids[static_cast<unsigned>(i)]};
    NvmlMemory memory{};
    if (NvmlReturn rc = api_->get_memory(device, &memory); rc != kSuccess) {
      return absl::UnavailableError(api_->Error("nvmlDeviceGetMemoryInfo", rc));
    }
    gpu.memory_total_bytes = static_cast<int64_t>(memory.total);
    gpu.memory_used_bytes = static_cast<int64_t>(memory.used);
    char name[kNameBufferSize] = {};
    if (api_->get_name(device, name, sizeof name) == kSuccess) gpu.name = name;
    // The process list: asked for with room for a few more than there were, as it may grow
    // between the two calls.
    std::vector<NvmlProcessInfo> processes;
    unsigned n = 0;
    NvmlReturn rc = api_->get_processes(device, &n, nullptr);
    for (int attempt = 0; attempt < 3 && rc == kErrorInsufficientSize; ++attempt) {
      processes.resize(n + 8);
      n = static_cast<unsigned>(processes.size());
      rc = api_->get_processes(device, &n, processes.data());
    }
    if (rc == kSuccess) {
      int64_t own = 0;
      bool known = true;
      for (unsigned p = 0; p < n && p < processes.size(); ++p) {
        if (!IsOwn(static_cast<pid_t>(processes[p].pid))) continue;
        if (processes[p].used_gpu_memory == kValueNotAvailable) known = false;
        own += static_cast<int64_t>(processes[p].used_gpu_memory);
      }
      if (known) gpu.memory_used_by_worker_bytes = own;
    }
    out.push_back(std::move(gpu));
  }
  return out;
}

std::vector<int> CudaVisibleIndices(const std::optional<std::string>& value,
                                    const std::vector<std::string>& uuids) {
  std::vector<int> out;
  if (!value.has_value()) {
    for (size_t i = 0; i < uuids.size(); ++i) out.push_back(static_cast<int>(i));
    return out;
  }
  std::set<int> seen;
  for (absl::string_view entry : absl::StrSplit(*value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = -1;
    if (int n = 0; absl::SimpleAtoi(entry, &n)) {
      if (n >= 0 && static_cast<size_t>(n) < uuids.size()) index = n;
    } else if (!entry.empty()) {
      // A UUID, or the start of one that names a single device.
      for (size_t i = 0; i < uuids.size(); ++i) {
        if (!absl::StartsWith(uuids[i], entry)) continue;
        if (index >= 0) {
          index = -1;  // ambiguous
          break;
        }
        index = static_cast<int>(i);
      }
    }
    if (index < 0 || !seen.insert(index).second) break;
    out.push_back(index);
  }
  return out;
}

}  // namespace dispatchd::client
