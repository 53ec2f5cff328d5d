#pragma once

// Reads the host's GPUs and their memory from NVML, the NVIDIA driver's management library, loaded
// with dlopen at run time: nothing links against it, and a host without it still runs.
//
//   absl::StatusOr<std::unique_ptr<NvmlReader>> nvml = NvmlReader::Open(library);
//   if (nvml.ok()) absl::StatusOr<std::vector<GpuReading>> gpus = (*nvml)->Read();
//
// Thread-safe: NVML is, and the reader does not change after Open.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dispatchd::client {

// One GPU as NVML reports it now.
struct GpuReading {
  // NVML's index of the device (as nvidia-smi numbers it).
  int index = 0;
  std::string name;
  std::string uuid;
  int64_t memory_total_bytes = 0;
  // In use on the device by every process (nvmlDeviceGetMemoryInfo `used`).
  int64_t memory_used_bytes = 0;
  // Of that, what this process and its descendants hold (NVML's compute processes whose pid is
  // one of them); nullopt when NVML cannot say (not supported, not permitted, or no process
  // list).
  std::optional<int64_t> memory_used_by_worker_bytes;
};

class NvmlReader {
 public:
  // The library the environment's DISPATCHD_NVML_LIBRARY names, else "libnvidia-ml.so.1".
  static std::string DefaultLibrary();

  // Loads `library` (a path, or a name dlopen looks up), resolves the NVML functions the reader
  // uses and initializes NVML. UNAVAILABLE, saying why, when the library cannot be loaded, lacks
  // one of those functions, or its nvmlInit_v2 fails (no driver, no device).
  static absl::StatusOr<std::unique_ptr<NvmlReader>> Open(const std::string& library);

  // Shuts NVML down and unloads the library.
  ~NvmlReader();
  NvmlReader(const NvmlReader&) = delete;
  NvmlReader& operator=(const NvmlReader&) = delete;

  // The GPUs this process may use, in CUDA's order: every device NVML lists, or those that the
  // environment's CUDA_VISIBLE_DEVICES names (by index or UUID prefix, up to the first entry
  // that names none, as CUDA reads it). UNAVAILABLE when NVML fails to answer.
  absl::StatusOr<std::vector<GpuReading>> Read() const;

  struct Api;  // the NVML functions, resolved by Open

 private:
  NvmlReader(void* handle, std::unique_ptr<Api> api);

  void* const handle_;
  const std::unique_ptr<Api> api_;
};

// Which of `uuids` (every device, in NVML's index order) a CUDA_VISIBLE_DEVICES value leaves
// visible, as indices into `uuids` in CUDA's order; nullopt `value` (unset) means all.
std::vector<int> CudaVisibleIndices(const std::optional<std::string>& value,
                                    const std::vector<std::string>& uuids);

}  // namespace dispatchd::client
