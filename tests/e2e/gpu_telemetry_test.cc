// GPU readings: a worker reports the GPUs NVML lists (the stand-in library here) in Hello and
// their memory in heartbeats, the daemon shows them, and its memory throttle counts only the GPU
// memory other processes hold.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <stdlib.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGB = 1'000'000'000;

// Writes what the NVML stand-in answers: one line per GPU, then the processes on them.
void WriteNvml(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string Gpu(int64_t total_gb, int64_t used_gb, const std::string& uuid,
                const std::string& name) {
  return absl::StrCat("gpu ", total_gb * kGB, " ", used_gb * kGB, " ", uuid, " ", name, "\n");
}

std::string Proc(int gpu, const std::string& pid, int64_t gb) {
  return absl::StrCat("proc ", gpu, " ", pid, " ", gb * kGB, "\n");
}

// The worker named `id` as ListWorkers shows it now; an empty WorkerInfo if it is not there.
v1::WorkerInfo WorkerNamed(Daemon& d, const std::string& id) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = d.Workers();
  if (workers.ok()) {
    for (const v1::WorkerInfo& w : *workers) {
      if (w.worker_id() == id) return w;
    }
  }
  return {};
}

class GpuTelemetryTest : public E2eTest {
 protected:
  void TearDown() override { unsetenv("NVML_STANDIN_FILE"); }

  // Starts a worker whose NVML stand-in answers from `nvml_file`.
  std::unique_ptr<Worker> StartGpuWorker(const Daemon& d, const std::string& nvml_file,
                                         const WorkerOptions& options) {
    setenv("NVML_STANDIN_FILE", nvml_file.c_str(), 1);
    std::unique_ptr<Worker> w = StartWorker(d, options);
    unsetenv("NVML_STANDIN_FILE");
    return w;
  }
};

TEST_F(GpuTelemetryTest, WorkerReportsItsGpusAndTheirMemoryAndTheDaemonShowsThem) {
  std::unique_ptr<Daemon> daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  Daemon& d = *daemon;
  const std::string nvml = dir_.File("nvml");
  const std::string gpus = Gpu(80, 10, "GPU-aaaa-1111", "NVIDIA H100 80GB HBM3") +
                           Gpu(40, 1, "GPU-bbbb-2222", "NVIDIA A100-SXM4-40GB");
  WriteNvml(nvml, gpus + Proc(0, "self", 8));
  std::unique_ptr<Worker> worker = StartGpuWorker(d, nvml, {.id = "gpu-host"});
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(d.WaitForWorkers(1));

  // Hello: both GPUs, their names and memory; the daemon's VRAM is their total.
  v1::WorkerInfo w = WorkerNamed(d, "gpu-host");
  ASSERT_EQ(w.gpus_size(), 2) << w.DebugString();
  EXPECT_EQ(w.gpus(0).id(), "0");
  EXPECT_EQ(w.gpus(0).name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(w.gpus(0).uuid(), "GPU-aaaa-1111");
  EXPECT_EQ(w.gpus(0).memory_total_bytes(), 80 * kGB);
  EXPECT_EQ(w.gpus(1).id(), "1");
  EXPECT_EQ(w.gpus(1).name(), "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(w.gpus(1).memory_total_bytes(), 40 * kGB);
  EXPECT_DOUBLE_EQ(w.vram_gb(), 120);

  // Heartbeats: the memory in use now, and the worker's own share of it.
  WriteNvml(nvml, Gpu(80, 20, "GPU-aaaa-1111", "NVIDIA H100 80GB HBM3") +
                      Gpu(40, 1, "GPU-bbbb-2222", "NVIDIA A100-SXM4-40GB") + Proc(0, "self", 8));
  ASSERT_TRUE(WaitFor(
      [&] {
        w = WorkerNamed(d, "gpu-host");
        return w.gpus_size() == 2 && w.gpus(0).memory_used_bytes() == 20 * kGB;
      },
      absl::Seconds(10)))
      << w.DebugString();
  EXPECT_EQ(w.gpus(0).memory_used_by_worker_bytes(), 8 * kGB);
  EXPECT_EQ(w.gpus(1).memory_used_bytes(), 1 * kGB);
  EXPECT_TRUE(w.gpus(1).has_memory_used_by_worker_bytes());
  EXPECT_EQ(w.gpus(1).memory_used_by_worker_bytes(), 0);

  CommandResult table = d.Ctl({"workers"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("20/80 (own 8), 1/40 (own 0)"));
}

TEST_F(GpuTelemetryTest, AWorkerHoldingItsOwnGpuKeepsGettingJobsOneCrowdedByOthersDoesNot) {
  DaemonOptions options;
  options.types = {{.name = "generate"}, {.name = "embed"}};
  options.extra_yaml = "memory_throttle:\n  gpu_percent: 85\n  gpu_resume_percent: 75\n";
  std::unique_ptr<Daemon> daemon = StartDaemon(options);
  ASSERT_NE(daemon, nullptr);
  Daemon& d = *daemon;

  // A server that preallocated 72 of 80 GB for itself, as vLLM does: 92.5% in use, 2.5% by
  // others.
  const std::string preallocated = dir_.File("nvml-preallocated");
  WriteNvml(preallocated, Gpu(80, 74, "GPU-aaaa", "NVIDIA H100") + Proc(0, "self", 72));
  // The same use on another worker's GPU, held by a process that is not the worker's (pid 1).
  const std::string crowded = dir_.File("nvml-crowded");
  WriteNvml(crowded, Gpu(80, 74, "GPU-bbbb", "NVIDIA H100") + Proc(0, "1", 72));
  std::unique_ptr<Worker> server =
      StartGpuWorker(d, preallocated, {.id = "vllm", .types = {"generate"}});
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Worker> other = StartGpuWorker(d, crowded, {.id = "crowded", .types = {"embed"}});
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(d.WaitForWorkers(2));

  // A reading only a heartbeat brings (and the throttle is decided on the same heartbeat).
  WriteNvml(preallocated, Gpu(80, 75, "GPU-aaaa", "NVIDIA H100") + Proc(0, "self", 72));
  WriteNvml(crowded, Gpu(80, 75, "GPU-bbbb", "NVIDIA H100") + Proc(0, "1", 72));
  v1::WorkerInfo vllm, busy;
  ASSERT_TRUE(WaitFor(
      [&] {
        vllm = WorkerNamed(d, "vllm");
        busy = WorkerNamed(d, "crowded");
        return vllm.gpus_size() == 1 && vllm.gpus(0).memory_used_bytes() == 75 * kGB &&
               busy.gpus_size() == 1 && busy.gpus(0).memory_used_bytes() == 75 * kGB;
      },
      absl::Seconds(10)))
      << vllm.DebugString() << busy.DebugString();
  EXPECT_FALSE(vllm.memory_throttled()) << vllm.DebugString();
  EXPECT_TRUE(busy.memory_throttled()) << busy.DebugString();

  // The preallocating server runs its jobs, one after another.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> id = d.Submit(Spec("generate", absl::StrCat("prompt ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> done;
  ASSERT_TRUE(d.WaitForTerminal(ids, &done, absl::Seconds(15)));
  for (const v1::Job& job : done) EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);

  // The crowded worker's job waits on memory.
  absl::StatusOr<std::string> held = d.Submit(Spec("embed", "text"));
  ASSERT_TRUE(held.ok()) << held.status();
  std::string reason;
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = d.Status(*held);
        reason = job.ok() ? job->wait_reason() : "";
        return reason == "memory";
      },
      absl::Seconds(10)))
      << "wait_reason " << reason;
  CommandResult table = d.Ctl({"workers"});
  EXPECT_THAT(table.out, HasSubstr("crowded (throttled)"));
}

}  // namespace
}  // namespace dispatchd::e2e
