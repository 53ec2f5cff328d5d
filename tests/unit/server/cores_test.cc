// The CPU quota a process's cgroups allow, read from a cgroup tree the test lays out, and the
// usable cores the daemon sizes its turns in flight by.
#include "server/util/cores.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include <stdlib.h>

namespace dispatchd::server {
namespace {

class CgroupCpuQuotaTest : public ::testing::Test {
 protected:
  CgroupCpuQuotaTest() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cores_test.XXXXXX").string();
    const char* dir = mkdtemp(tmpl.data());
    if (dir == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    root_ = dir != nullptr ? dir : tmpl;
  }
  ~CgroupCpuQuotaTest() override { std::filesystem::remove_all(root_); }

  // Writes `text` to `file` under the cgroup root, making its directories.
  void Put(const std::string& file, const std::string& text) {
    const std::filesystem::path path = std::filesystem::path(root_) / file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }

  std::string root_;
};

TEST_F(CgroupCpuQuotaTest, V2TakesTheSmallestQuotaOfTheCgroupAndThoseAboveIt) {
  const std::string self = "0::/system.slice/dispatchd.service\n";
  Put("system.slice/dispatchd.service/cpu.max", "150000 100000");
  EXPECT_EQ(CgroupCpuQuota(self, root_), 1.5);
  Put("system.slice/cpu.max", "50000 100000");  // the slice allows half a core
  EXPECT_EQ(CgroupCpuQuota(self, root_), 0.5);
}

TEST_F(CgroupCpuQuotaTest, V2MaxIsNoQuota) {
  Put("system.slice/dispatchd.service/cpu.max", "max 100000");
  Put("system.slice/cpu.max", "max 100000");
  EXPECT_EQ(CgroupCpuQuota("0::/system.slice/dispatchd.service\n", root_), std::nullopt);
}

TEST_F(CgroupCpuQuotaTest, AContainerThatSeesItsCgroupAsTheRootReadsTheRoot) {
  // The host's path is not under the container's mount: its own cgroup is the mount's root.
  Put("cpu.max", "300000 100000");
  EXPECT_EQ(CgroupCpuQuota("0::/kubepods/burstable/pod1/abc\n", root_), 3.0);
}

TEST_F(CgroupCpuQuotaTest, V1ReadsTheCfsQuotaOfTheCpuController) {
  const std::string self =
      "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n";
  Put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000");
  Put("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000");
  EXPECT_EQ(CgroupCpuQuota(self, root_), 2.0);
  Put("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1");  // none
  EXPECT_EQ(CgroupCpuQuota(self, root_), std::nullopt);
}

TEST_F(CgroupCpuQuotaTest, NothingReadableIsNoQuota) {
  EXPECT_EQ(CgroupCpuQuota("", root_), std::nullopt);
  EXPECT_EQ(CgroupCpuQuota("0::/system.slice/dispatchd.service\n", root_), std::nullopt);
  Put("cpu.max", "garbage");
  EXPECT_EQ(CgroupCpuQuota("0::/\n", root_), std::nullopt);
}

TEST(UsableCoresTest, AtLeastOneAndNoMoreThanTheMachineHas) {
  const unsigned cores = UsableCores();
  EXPECT_GE(cores, 1u);
  EXPECT_LE(cores, std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace dispatchd::server
