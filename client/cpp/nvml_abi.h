#pragma once

// The part of NVML's C API (nvml.h) that NvmlReader calls, declared here so that nothing needs
// NVIDIA's headers to build. NvmlReader loads the library with dlopen and calls each function
// through a pointer of the type below; tests/testing/nvml_standin.cc defines the same functions
// with these same types. A call through a pointer to another function type is undefined
// behaviour, even where the two agree on the machine (clang's -fsanitize=function, part of
// tests/sanitize.sh's UBSan, checks it), so the types are written once, here.

namespace dispatchd::nvml_abi {

using Return = int;  // nvmlReturn_t: the values of it that the reader and the stand-in use
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorGpuIsLost = 15;

// nvmlDevice_t: a pointer to a type NVML never defines.
struct DeviceHandle;
using Device = DeviceHandle*;

// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
inline constexpr unsigned kNameBufferSize = 96;
inline constexpr unsigned kUuidBufferSize = 96;
// NVML_VALUE_NOT_AVAILABLE, which usedGpuMemory holds where the driver may not tell.
inline constexpr unsigned long long kValueNotAvailable = ~0ULL;

// nvmlMemory_t.
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// nvmlProcessInfo_t, as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
struct ProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

// The functions, by the name NVML exports them under.
using InitFn = Return();                                         // nvmlInit_v2
using ShutdownFn = Return();                                     // nvmlShutdown
using ErrorStringFn = const char*(Return);                       // nvmlErrorString
using GetCountFn = Return(unsigned*);                            // nvmlDeviceGetCount_v2
using GetHandleFn = Return(unsigned, Device*);                   // nvmlDeviceGetHandleByIndex_v2
using GetMemoryFn = Return(Device, Memory*);                     // nvmlDeviceGetMemoryInfo
using GetNameFn = Return(Device, char*, unsigned);               // nvmlDeviceGetName
using GetUuidFn = Return(Device, char*, unsigned);               // nvmlDeviceGetUUID
using GetProcessesFn = Return(Device, unsigned*, ProcessInfo*);  // ..._v3

}  // namespace dispatchd::nvml_abi
