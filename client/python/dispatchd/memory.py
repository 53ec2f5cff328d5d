"""What a worker reports of its memory: its GPUs, the MemoryReport a memory probe returns, and
the host RAM read from /proc/meminfo when there is no probe or it fails.

Gpu and MemoryReport are re-exported by dispatchd and dispatchd.worker.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

# The worker's logger: these lines belong to the worker's log, whichever module writes them.
_log = logging.getLogger("dispatchd.worker")

class Gpu(NamedTuple):
    """One GPU on the worker's host: an id (index or UUID) and its memory in bytes."""
    id: str
    memory_total_bytes: int


class MemoryReport(NamedTuple):
    """Memory in use, for heartbeats: host RAM, and per GPU of `gpus` the bytes in use. The
    daemon stops sending jobs to a worker over its throttle thresholds."""
    ram_used_bytes: int
    ram_total_bytes: int
    gpu_used_bytes: Sequence[int] = ()


def read_meminfo():
    """Host RAM (used, total) in bytes from /proc/meminfo; zeros where it cannot be read."""
    total = available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif key == "MemAvailable":
                    available = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if not total or available is None:
        return 0, total or 0
    return total - available, total


def fill_memory(heartbeat, memory_probe, worker_id):
    """Sets the RAM and GPU use of `heartbeat` (whose gpus are filled in) from `memory_probe`,
    or host RAM from /proc/meminfo if it is None or fails: a heartbeat goes out regardless."""
    report = None
    if memory_probe is not None:
        try:
            report = memory_probe()
            heartbeat.ram_used_bytes = int(report.ram_used_bytes)
            heartbeat.ram_total_bytes = int(report.ram_total_bytes)
            for gpu, used in zip(heartbeat.gpus, report.gpu_used_bytes):
                gpu.memory_used_bytes = int(used)
                gpu.ClearField("memory_used_by_worker_bytes")  # the probe's figure counts whole
        except Exception as e:  # noqa: BLE001  (a heartbeat must go out regardless)
            _log.warning("memory_probe failed worker=%s: %s: %s (reporting host RAM)",
                         worker_id, type(e).__name__, e)
            report = None
            for gpu in heartbeat.gpus:
                gpu.memory_used_bytes = 0
                gpu.ClearField("memory_used_by_worker_bytes")
    if report is None:
        heartbeat.ram_used_bytes, heartbeat.ram_total_bytes = read_meminfo()
