// The NVML reader against the stand-in library (tests/testing/nvml_standin.cc), which answers
// from the file NVML_STANDIN_FILE names.
#include "client/cpp/nvml_reader.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <stdlib.h>
#include <unistd.h>

#include "tests/testing/status_matchers.h"
#include "tests/unit/client/subprocess.h"

namespace dispatchd::client {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kGiB = int64_t{1} << 30;

class NvmlReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/nvml_reader_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    file_ = dir_ + "/nvml";
    setenv("NVML_STANDIN_FILE", file_.c_str(), 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  void TearDown() override {
    unlink(file_.c_str());
    rmdir(dir_.c_str());
  }

  void Write(const std::string& text) const { std::ofstream(file_) << text; }

  absl::StatusOr<std::vector<GpuReading>> ReadOnce() const {
    absl::StatusOr<std::unique_ptr<NvmlReader>> nvml = NvmlReader::Open(NVML_STANDIN_LIB);
    if (!nvml.ok()) return nvml.status();
    return (*nvml)->Read();
  }

  std::string dir_;
  std::string file_;
};

const char kTwoGpus[] =
    "gpu 85899345920 10737418240 GPU-aaaa-1111 NVIDIA H100 80GB HBM3\n"
    "gpu 42949672960 0 GPU-bbbb-2222 NVIDIA A100-SXM4-40GB\n";

TEST_F(NvmlReaderTest, ReadsEachGpusNameUuidAndMemory) {
  Write(kTwoGpus);
  absl::StatusOr<std::vector<GpuReading>> gpus = ReadOnce();
  ASSERT_THAT(gpus, IsOk());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].index, 0);
  EXPECT_EQ((*gpus)[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ((*gpus)[0].uuid, "GPU-aaaa-1111");
  EXPECT_EQ((*gpus)[0].memory_total_bytes, 80 * kGiB);
  EXPECT_EQ((*gpus)[0].memory_used_bytes, 10 * kGiB);
  EXPECT_EQ((*gpus)[0].memory_used_by_worker_bytes, std::optional<int64_t>(0));
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ((*gpus)[1].name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ((*gpus)[1].memory_total_bytes, 40 * kGiB);
}

TEST_F(NvmlReaderTest, EachReadSeesTheMemoryInUseNow) {
  Write(kTwoGpus);
  absl::StatusOr<std::unique_ptr<NvmlReader>> nvml = NvmlReader::Open(NVML_STANDIN_LIB);
  ASSERT_THAT(nvml, IsOk());
  Write("gpu 85899345920 75161927680 GPU-aaaa-1111 NVIDIA H100 80GB HBM3\n");
  absl::StatusOr<std::vector<GpuReading>> gpus = (*nvml)->Read();
  ASSERT_THAT(gpus, IsOk());
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].memory_used_bytes, 70 * kGiB);
}

TEST_F(NvmlReaderTest, CountsTheMemoryOfThisProcessAndItsChildrenOnly) {
  fake::Subprocess child({"/bin/sleep", "30"}, dir_ + "/child");
  ASSERT_TRUE(child.started());
  Write(absl::StrCat(kTwoGpus, "proc 0 self ", 5 * kGiB, "\n",     // this process
                     "proc 0 ", child.pid(), " ", 2 * kGiB, "\n",  // its child
                     "proc 0 1 ", 3 * kGiB, "\n",                  // init: another's
                     "proc 1 1 ", 1 * kGiB, "\n"));
  absl::StatusOr<std::vector<GpuReading>> gpus = ReadOnce();
  ASSERT_THAT(gpus, IsOk());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].memory_used_by_worker_bytes, std::optional<int64_t>(7 * kGiB));
  EXPECT_EQ((*gpus)[1].memory_used_by_worker_bytes, std::optional<int64_t>(0));
}

TEST_F(NvmlReaderTest, NoProcessListLeavesTheWorkersShareUnknown) {
  Write(absl::StrCat(kTwoGpus, "proc 0 self ", 5 * kGiB, "\nfail processes\n"));
  absl::StatusOr<std::vector<GpuReading>> gpus = ReadOnce();
  ASSERT_THAT(gpus, IsOk());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].memory_used_bytes, 10 * kGiB);
  EXPECT_EQ((*gpus)[0].memory_used_by_worker_bytes, std::nullopt);
}

TEST_F(NvmlReaderTest, AMissingLibraryIsUnavailable) {
  EXPECT_THAT(NvmlReader::Open(dir_ + "/libnvidia-ml.so.1"),
              StatusIs(absl::StatusCode::kUnavailable, "cannot load"));
}

TEST_F(NvmlReaderTest, ALibraryWithoutTheNvmlFunctionsIsUnavailable) {
  EXPECT_THAT(NvmlReader::Open("libm.so.6"),
              StatusIs(absl::StatusCode::kUnavailable, "has no nvmlInit_v2"));
}

TEST_F(NvmlReaderTest, AnInitFailureIsUnavailableAndSaysWhy) {
  Write(absl::StrCat(kTwoGpus, "fail init\n"));
  EXPECT_THAT(NvmlReader::Open(NVML_STANDIN_LIB),
              StatusIs(absl::StatusCode::kUnavailable, "nvmlInit_v2: Driver Not Loaded"));
  unsetenv("NVML_STANDIN_FILE");  // the stand-in's host without a driver
  EXPECT_THAT(NvmlReader::Open(NVML_STANDIN_LIB), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(NvmlReaderTest, AFailedMemoryReadIsUnavailable) {
  Write(kTwoGpus);
  absl::StatusOr<std::unique_ptr<NvmlReader>> nvml = NvmlReader::Open(NVML_STANDIN_LIB);
  ASSERT_THAT(nvml, IsOk());
  Write(absl::StrCat(kTwoGpus, "fail memory\n"));
  EXPECT_THAT((*nvml)->Read(),
              StatusIs(absl::StatusCode::kUnavailable, "nvmlDeviceGetMemoryInfo: GPU is lost"));
}

TEST_F(NvmlReaderTest, OnlyTheGpusCudaVisibleDevicesNamesAreRead) {
  Write(kTwoGpus);
  setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb", 1);
  absl::StatusOr<std::vector<GpuReading>> gpus = ReadOnce();
  ASSERT_THAT(gpus, IsOk());
  ASSERT_EQ(gpus->size(), 1u);
  EXPECT_EQ((*gpus)[0].index, 1);
  EXPECT_EQ((*gpus)[0].name, "NVIDIA A100-SXM4-40GB");
}

TEST(CudaVisibleIndicesTest, ReadsIndicesAndUuidsUpToTheFirstInvalidEntry) {
  const std::vector<std::string> uuids = {"GPU-aaaa", "GPU-abcd", "GPU-bbbb"};
  EXPECT_THAT(CudaVisibleIndices(std::nullopt, uuids), ElementsAre(0, 1, 2));
  EXPECT_THAT(CudaVisibleIndices("2,0", uuids), ElementsAre(2, 0));
  EXPECT_THAT(CudaVisibleIndices("GPU-b, GPU-abcd", uuids), ElementsAre(2, 1));
  EXPECT_THAT(CudaVisibleIndices("1,7,0", uuids), ElementsAre(1));  // 7 names none: stop
  EXPECT_THAT(CudaVisibleIndices("GPU-a", uuids), IsEmpty());       // ambiguous
  EXPECT_THAT(CudaVisibleIndices("0,0", uuids), ElementsAre(0));
  EXPECT_THAT(CudaVisibleIndices("", uuids), IsEmpty());
  EXPECT_THAT(CudaVisibleIndices("-1", uuids), IsEmpty());
}

}  // namespace
}  // namespace dispatchd::client
