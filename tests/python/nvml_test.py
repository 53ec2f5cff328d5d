"""The Python SDK's NVML reader (dispatchd/nvml.py) against the stand-in library of tests/testing
(DISPATCHD_NVML_LIBRARY names it), which answers from the file NVML_STANDIN_FILE names."""

import os
import subprocess
import tempfile
import unittest

from dispatchd import nvml
from dispatchd.v1 import worker_service_pb2 as pb

GIB = 1 << 30
TWO_GPUS = ("gpu 85899345920 10737418240 GPU-aaaa-1111 NVIDIA H100 80GB HBM3\n"
            "gpu 42949672960 0 GPU-bbbb-2222 NVIDIA A100-SXM4-40GB\n")


class NvmlTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.file = os.path.join(self.dir.name, "nvml")
        os.environ["NVML_STANDIN_FILE"] = self.file
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        self.assertTrue(os.environ.get("DISPATCHD_NVML_LIBRARY"), "the stand-in is not set")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, text):
        with open(self.file, "w") as f:
            f.write(text)

    def read_once(self):
        reader = nvml.Nvml()
        try:
            return reader.read()
        finally:
            reader.close()

    def test_reads_each_gpus_name_uuid_and_memory(self):
        self.write(TWO_GPUS)
        gpus = self.read_once()
        self.assertEqual(gpus, [
            nvml.GpuReading(0, "NVIDIA H100 80GB HBM3", "GPU-aaaa-1111", 80 * GIB, 10 * GIB, 0),
            nvml.GpuReading(1, "NVIDIA A100-SXM4-40GB", "GPU-bbbb-2222", 40 * GIB, 0, 0)])

    def test_counts_the_memory_of_this_process_and_its_children_only(self):
        with subprocess.Popen(["sleep", "30"]) as child:
            try:
                self.write(TWO_GPUS + f"proc 0 self {5 * GIB}\nproc 0 {child.pid} {2 * GIB}\n"
                                      f"proc 0 1 {3 * GIB}\nproc 1 1 {GIB}\n")
                gpus = self.read_once()
            finally:
                child.kill()
        self.assertEqual([g.memory_used_by_worker_bytes for g in gpus], [7 * GIB, 0])

    def test_no_process_list_leaves_the_workers_share_unknown(self):
        self.write(TWO_GPUS + f"proc 0 self {5 * GIB}\nfail processes\n")
        gpus = self.read_once()
        self.assertEqual(gpus[0].memory_used_bytes, 10 * GIB)
        self.assertIsNone(gpus[0].memory_used_by_worker_bytes)

    def test_a_missing_library_an_incomplete_one_and_an_init_failure_say_why(self):
        with self.assertRaisesRegex(nvml.NvmlError, "cannot load"):
            nvml.Nvml(os.path.join(self.dir.name, "libnvidia-ml.so.1"))
        with self.assertRaisesRegex(nvml.NvmlError, "has no nvmlInit_v2"):
            nvml.Nvml("libm.so.6")
        self.write(TWO_GPUS + "fail init\n")
        with self.assertRaisesRegex(nvml.NvmlError, r"nvmlInit_v2: Driver Not Loaded \(9\)"):
            nvml.Nvml()

    def test_only_the_gpus_cuda_visible_devices_names_are_read(self):
        self.write(TWO_GPUS)
        os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-bbbb"
        try:
            gpus = self.read_once()
        finally:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        self.assertEqual([g.index for g in gpus], [1])
        uuids = ["GPU-aaaa", "GPU-abcd", "GPU-bbbb"]
        self.assertEqual(nvml.cuda_visible_indices(None, uuids), [0, 1, 2])
        self.assertEqual(nvml.cuda_visible_indices("2,0", uuids), [2, 0])
        self.assertEqual(nvml.cuda_visible_indices("1,7,0", uuids), [1])
        self.assertEqual(nvml.cuda_visible_indices("GPU-a", uuids), [])
        self.assertEqual(nvml.cuda_visible_indices("", uuids), [])

    def test_the_worker_reports_nvml_gpus_with_live_use_unless_told_its_gpus(self):
        self.write(TWO_GPUS)
        source = nvml.GpuSource([], True, "w")
        self.write(TWO_GPUS.replace("10737418240", str(70 * GIB)) + f"proc 0 self {60 * GIB}\n")
        gpus = source.gpus(pb)
        self.assertEqual([(g.id, g.name, g.memory_total_bytes, g.memory_used_bytes)
                          for g in gpus],
                         [("0", "NVIDIA H100 80GB HBM3", 80 * GIB, 70 * GIB),
                          ("1", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0)])
        self.assertEqual(gpus[0].memory_used_by_worker_bytes, 60 * GIB)
        # A failed reading keeps the GPUs, with no use.
        self.write(TWO_GPUS + "fail memory\n")
        with self.assertLogs("dispatchd.worker", "WARNING"):
            gpus = source.gpus(pb)
        self.assertEqual([(g.id, g.memory_used_bytes, g.HasField("memory_used_by_worker_bytes"))
                          for g in gpus], [("0", 0, False), ("1", 0, False)])
        # Configured GPUs, or none, override NVML.
        told = nvml.GpuSource([pb.Gpu(id="x", memory_total_bytes=GIB)], True, "w")
        self.assertEqual([(g.id, g.memory_total_bytes) for g in told.gpus(pb)], [("x", GIB)])
        self.assertEqual(nvml.GpuSource([], False, "w").gpus(pb), [])

    def test_no_driver_means_no_gpus_and_one_log_line(self):
        self.write(TWO_GPUS + "fail init\n")
        with self.assertLogs("dispatchd.worker", "INFO") as logs:
            source = nvml.GpuSource([], True, "w")
        self.assertEqual(len(logs.output), 1)
        self.assertIn("no GPU readings worker=w: nvmlInit_v2: Driver Not Loaded", logs.output[0])
        self.assertEqual(source.gpus(pb), [])


if __name__ == "__main__":
    unittest.main()
