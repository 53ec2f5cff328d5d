#include "server/util/cores.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include <sched.h>

namespace dispatchd::server {
namespace {

std::optional<std::string> ReadSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// cgroup v2's cpu.max: "QUOTA PERIOD" in microseconds, or "max PERIOD" for none.
std::optional<double> QuotaV2(const std::filesystem::path& dir) {
  std::optional<std::string> text = ReadSmallFile(dir / "cpu.max");
  if (!text) return std::nullopt;
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
  double quota = 0, period = 0;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &quota) ||
      !absl::SimpleAtod(parts[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;  // "max", or not a quota
  }
  return quota / period;
}

// cgroup v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
std::optional<double> QuotaV1(const std::filesystem::path& dir) {
  std::optional<std::string> quota_text = ReadSmallFile(dir / "cpu.cfs_quota_us");
  std::optional<std::string> period_text = ReadSmallFile(dir / "cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (!quota_text || !period_text ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*quota_text), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*period_text), &period) || quota <= 0 ||
      period <= 0) {
    return std::nullopt;
  }
  return quota / period;
}

// The smallest quota `read` finds in `mount` + `path` and each directory above it, up to and
// including `mount`.
template <typename Read>
std::optional<double> SmallestUpward(const std::filesystem::path& mount, absl::string_view path,
                                     Read read) {
  std::string rel(absl::StripPrefix(absl::StripSuffix(path, "/"), "/"));  // "a/b/c", or ""
  std::error_code ec;
  if (!rel.empty() && !std::filesystem::is_directory(mount / rel, ec)) rel.clear();
  std::optional<double> best;
  while (true) {
    std::optional<double> q = read(rel.empty() ? mount : mount / rel);
    if (q && (!best || *q < *best)) best = q;
    if (rel.empty()) return best;
    const size_t slash = rel.rfind('/');
    rel = slash == std::string::npos ? "" : rel.substr(0, slash);
  }
}

}  // namespace

std::optional<double> CgroupCpuQuota(absl::string_view self_cgroup, const std::string& root) {
  const std::filesystem::path mount(root);
  std::optional<double> best;
  auto take = [&best](std::optional<double> q) {
    if (q && (!best || *q < *best)) best = q;
  };
  // Each line is "ID:CONTROLLERS:PATH": "0::PATH" for cgroup v2, "4:cpu,cpuacct:PATH" for v1.
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      take(SmallestUpward(mount, f[2], QuotaV2));
      continue;
    }
    std::vector<absl::string_view> controllers = absl::StrSplit(f[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") == controllers.end()) continue;
    // v1 mounts the controller at root/cpu (a link to root/cpu,cpuacct on most systems).
    for (const std::string& name : {std::string(f[1]), std::string("cpu")}) {
      if (std::error_code ec; std::filesystem::is_directory(mount / name, ec)) {
        take(SmallestUpward(mount / name, f[2], QuotaV1));
        break;
      }
    }
  }
  return best;
}

unsigned UsableCores() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cores = std::max(1, CPU_COUNT(&set));
  }
  if (std::optional<std::string> text = ReadSmallFile("/proc/self/cgroup")) {
    if (std::optional<double> quota = CgroupCpuQuota(*text, "/sys/fs/cgroup")) {
      const double allowed = std::clamp(std::ceil(*quota - 1e-9), 1.0, static_cast<double>(cores));
      cores = static_cast<unsigned>(allowed);
    }
  }
  return cores;
}

}  // namespace dispatchd::server
