#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace dispatchd::server {

// The cores this process may run on: the CPUs of its affinity mask (taskset, systemd's
// CPUAffinity=, a container's cpuset), fewer where a CPU quota allows less (systemd's CPUQuota=,
// `docker run --cpus`, a Kubernetes CPU limit), rounded up; at least 1.
// std::thread::hardware_concurrency() counts the machine's CPUs and sees neither.
unsigned UsableCores();

// The CPU quota, in cores, that the cgroups of a process allow it: the smallest of cgroup v2's
// cpu.max, or cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us, over the process's own cgroup and
// each one above it. `self_cgroup` is the text of /proc/self/cgroup; `root` is where the cgroup
// file system is mounted (/sys/fs/cgroup). A cgroup directory that does not exist under `root`
// (a container that sees its own cgroup as the root) is read at the root instead. nullopt: no
// quota, or nothing readable.
std::optional<double> CgroupCpuQuota(absl::string_view self_cgroup, const std::string& root);

}  // namespace dispatchd::server
