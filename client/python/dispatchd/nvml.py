"""The host's GPUs and their memory from NVML, the NVIDIA driver's management library, loaded
with ctypes at run time: nothing needs it installed, and a host without it still runs. It reads
what the C++ SDK's reader (client/cpp/nvml_reader.h) reads, the same way.

    nvml = Nvml()              # NvmlError if there is no library, driver or device
    for gpu in nvml.read():    # GpuReading each, read afresh
        print(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_used_by_worker_bytes)

The library is libnvidia-ml.so.1, or the one the environment's DISPATCHD_NVML_LIBRARY names.
"""

import collections
import ctypes
import logging
import os
import threading

_log = logging.getLogger("dispatchd.worker")

GpuReading = collections.namedtuple(
    "GpuReading", "index name uuid memory_total_bytes memory_used_bytes "
                  "memory_used_by_worker_bytes")
GpuReading.__doc__ = ("One GPU as NVML reports it now: its NVML index, name, UUID, memory in all "
                      "and in use by every process, and of that what this process and its "
                      "descendants hold (None when NVML cannot say).")

_SUCCESS = 0
_ERROR_INSUFFICIENT_SIZE = 7
_VALUE_NOT_AVAILABLE = 2**64 - 1
_BUFFER_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE


class NvmlError(Exception):
    """NVML cannot be used or did not answer; the message says why."""


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (nvmlDeviceGetComputeRunningProcesses_v3)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


_FUNCTIONS = {
    # name: argument types (every one returns nvmlReturn_t, an int)
    "nvmlInit_v2": [],
    "nvmlShutdown": [],
    "nvmlDeviceGetCount_v2": [ctypes.POINTER(ctypes.c_uint)],
    "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)],
    "nvmlDeviceGetMemoryInfo": [ctypes.c_void_p, ctypes.POINTER(_Memory)],
    "nvmlDeviceGetName": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetUUID": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint],
    "nvmlDeviceGetComputeRunningProcesses_v3": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint),
                                                ctypes.POINTER(_ProcessInfo)],
}


def default_library():
    """The library the environment's DISPATCHD_NVML_LIBRARY names, else libnvidia-ml.so.1."""
    return os.environ.get("DISPATCHD_NVML_LIBRARY") or "libnvidia-ml.so.1"


def _parent_of(pid):
    """The parent of `pid` from /proc/PID/stat; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat[stat.rindex(")") + 1:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _is_own(pid):
    """Whether `pid` is this process or one of its descendants."""
    self_pid = os.getpid()
    for _ in range(64):
        if pid <= 1:
            return False
        if pid == self_pid:
            return True
        pid = _parent_of(pid)
    return False


def cuda_visible_indices(value, uuids):
    """Which of `uuids` (every device, in NVML's index order) a CUDA_VISIBLE_DEVICES value leaves
    visible, as indices in CUDA's order: entries are indices or UUID prefixes, read up to the
    first that names no single device; None (unset) means all."""
    if value is None:
        return list(range(len(uuids)))
    out = []
    for entry in value.split(","):
        entry = entry.strip()
        index = None
        try:
            n = int(entry)
            if 0 <= n < len(uuids):
                index = n
        except ValueError:
            matches = [i for i, u in enumerate(uuids) if entry and u.startswith(entry)]
            if len(matches) == 1:
                index = matches[0]
        if index is None or index in out:
            break
        out.append(index)
    return out


class Nvml:
    """NVML, loaded and initialized. Thread-safe (NVML is); close() shuts it down."""

    def __init__(self, library=None):
        """NvmlError saying why when the library cannot be loaded, lacks one of the functions
        read here, or its nvmlInit_v2 fails (no driver, no device)."""
        library = library or default_library()
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as e:
            raise NvmlError(f"cannot load {library}: {e}") from None
        for name, argtypes in _FUNCTIONS.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise NvmlError(f"{library} has no {name}") from None
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        try:
            self._lib.nvmlErrorString.argtypes = [ctypes.c_int]
            self._lib.nvmlErrorString.restype = ctypes.c_char_p
        except AttributeError:
            raise NvmlError(f"{library} has no nvmlErrorString") from None
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        self._open = True

    def _check(self, rc, call):
        if rc != _SUCCESS:
            text = self._lib.nvmlErrorString(rc)
            raise NvmlError(f"{call}: {text.decode(errors='replace') if text else 'unknown error'}"
                            f" ({rc})")

    def close(self):
        if getattr(self, "_open", False):
            self._open = False
            self._lib.nvmlShutdown()

    def read(self):
        """The GPUs this process may use, in CUDA's order (see cuda_visible_indices), as
        GpuReading; NvmlError when NVML fails to answer."""
        lib = self._lib
        count = ctypes.c_uint(0)
        self._check(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        devices, uuids = [], []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            self._check(lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)),
                        "nvmlDeviceGetHandleByIndex_v2")
            devices.append(handle)
            buf = ctypes.create_string_buffer(_BUFFER_SIZE)
            ok = lib.nvmlDeviceGetUUID(handle, buf, _BUFFER_SIZE) == _SUCCESS
            uuids.append(buf.value.decode(errors="replace") if ok else "")
        out = []
        for i in cuda_visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids):
            handle = devices[i]
            memory = _Memory()
            self._check(lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)),
                        "nvmlDeviceGetMemoryInfo")
            buf = ctypes.create_string_buffer(_BUFFER_SIZE)
            ok = lib.nvmlDeviceGetName(handle, buf, _BUFFER_SIZE) == _SUCCESS
            name = buf.value.decode(errors="replace") if ok else ""
            out.append(GpuReading(i, name, uuids[i], memory.total, memory.used,
                                  self._own_bytes(handle)))
        return out

    def _own_bytes(self, handle):
        """What this process and its descendants hold on the device; None if NVML cannot say."""
        fn = self._lib.nvmlDeviceGetComputeRunningProcesses_v3
        n = ctypes.c_uint(0)
        infos = None
        rc = fn(handle, ctypes.byref(n), None)
        for _ in range(3):  # the list may grow between the calls
            if rc != _ERROR_INSUFFICIENT_SIZE:
                break
            infos = (_ProcessInfo * (n.value + 8))()
            n = ctypes.c_uint(len(infos))
            rc = fn(handle, ctypes.byref(n), infos)
        if rc != _SUCCESS:
            return None
        own = 0
        for p in (infos[:n.value] if infos is not None else []):
            if _is_own(p.pid):
                if p.usedGpuMemory == _VALUE_NOT_AVAILABLE:
                    return None
                own += p.usedGpuMemory
        return own


class GpuSource:
    """The GPUs a worker reports: those configured (`gpus`, each with .id and
    .memory_total_bytes) when there are any, else those NVML reads when `use_nvml`, else none.
    Logs one line saying what NVML gave or why there are no readings. Thread-safe."""

    def __init__(self, gpus, use_nvml, worker_id):
        self._configured = list(gpus)
        self._nvml = None
        self._first = []
        self._failing = False
        self._lock = threading.Lock()
        if self._configured or not use_nvml:
            return
        try:
            nvml = Nvml()
            try:
                self._first = nvml.read()
            except NvmlError:
                nvml.close()
                raise
        except NvmlError as e:
            _log.info("no GPU readings worker=%s: %s", worker_id, e)
            return
        self._nvml = nvml
        _log.info("GPUs from NVML worker=%s count=%d: %s", worker_id, len(self._first),
                  "; ".join(f"{g.index} {g.name} {g.uuid} {g.memory_total_bytes / 1e9:.1f}GB"
                            for g in self._first))

    def gpus(self, pb):
        """The worker's GPUs as `pb.Gpu` messages with their memory now: read afresh from NVML
        (the GPUs of the first reading, in its order), or the configured totals."""
        out = [pb.Gpu(id=g.id, memory_total_bytes=g.memory_total_bytes)
               for g in self._configured]
        if self._nvml is None:
            return out
        try:
            now = {g.index: g for g in self._nvml.read()}
            failed = None
        except NvmlError as e:
            now, failed = {}, e
        with self._lock:
            if failed is not None and not self._failing:
                _log.warning("GPU readings failed: %s (reporting no GPU memory in use until "
                             "they work)", failed)
            self._failing = failed is not None
        for first in self._first:
            g = now.get(first.index) or first._replace(memory_used_bytes=0,
                                                       memory_used_by_worker_bytes=None)
            gpu = pb.Gpu(id=str(g.index), name=g.name, uuid=g.uuid,
                         memory_total_bytes=g.memory_total_bytes,
                         memory_used_bytes=g.memory_used_bytes)
            if g.memory_used_by_worker_bytes is not None:
                gpu.memory_used_by_worker_bytes = g.memory_used_by_worker_bytes
            out.append(gpu)
        return out
