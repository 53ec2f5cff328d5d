"""dispatchd.Client against a real daemon and dispatch-worker on 127.0.0.1.

Run by ctest, which provides the `pg` fixture's server and the binaries: DISPATCHD_TEST_PG_URL_FILE,
DISPATCHD_BIN, DISPATCH_WORKER_BIN, DISPATCHCTL_BIN. Test `python_client` runs these tests with
the build tree's package (PYTHONPATH=build/client/python), `python_wheel` with the wheel installed
into a fresh venv (tests/python/wheel_test.sh).
"""

import os
import pty
import time
import unittest
import uuid

import grpc

import dispatchd


from daemon_fixture import DaemonFixture


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fx = DaemonFixture()
        cls.client = dispatchd.Client(cls.fx.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.fx.close()

    def test_run_returns_the_workers_result(self):
        job = self.client.run("echo", b"hello from python", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"hello from python")
        self.assertEqual(job.worker_id, "py-w")
        self.assertEqual(job.attempt, 1)

    def test_submit_then_watch_to_the_end(self):
        job_id = self.client.submit("echo", "a str payload", labels={}, fairness_key="alice")
        states = [dispatchd.state_name(j.state) for j in self.client.watch(job_id, wait=60)]
        self.assertEqual(states[-1], "SUCCEEDED")
        job = self.client.status(job_id)
        self.assertEqual(job.result, b"a str payload")
        self.assertEqual(job.fairness_key, "alice")

    def test_idempotency_key_returns_the_same_job(self):
        key = uuid.uuid4().hex
        first = self.client.submit("echo", b"x", idempotency_key=key)
        second = self.client.submit("echo", b"x", idempotency_key=key)
        self.assertEqual(first, second)

    def test_submit_batch_is_all_or_none_and_names_the_bad_spec(self):
        ids = self.client.submit_batch([{"type": "echo", "payload": b"1"},
                                        {"type": "echo", "payload": b"2"}])
        self.assertEqual(len(ids), 2)
        with self.assertRaises(dispatchd.DispatchError) as err:
            self.client.submit_batch([{"type": "echo", "payload": b"ok"},
                                      {"type": "nope", "payload": b"x"}])
        self.assertEqual(err.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("specs[1].type", err.exception.message)

    def test_errors_carry_the_code_and_name_the_field(self):
        with self.assertRaises(dispatchd.DispatchError) as err:
            self.client.submit("no.such.type", b"x")
        self.assertEqual(err.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.type", err.exception.message)
        with self.assertRaises(dispatchd.DispatchError) as err:
            self.client.status("0" * 32)
        self.assertEqual(err.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_cancel_a_job_that_waits(self):
        job_id = self.client.submit("echo", b"later", not_before=_in(3600))
        job = self.client.cancel(job_id)
        self.assertEqual(dispatchd.state_name(job.state), "CANCELLED")
        with self.assertRaises(dispatchd.DispatchError) as err:
            self.client.cancel(job_id)
        self.assertEqual(err.exception.code, grpc.StatusCode.FAILED_PRECONDITION)

    def test_dispatchctl_watch_shows_a_progress_line_on_a_terminal(self):
        # dispatchctl, not this package: its progress line appears only on a terminal, which a
        # pseudo-terminal from Python provides.
        job_id = self.client.submit("echo", b"soon", not_before=_in(2.5))
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(os.environ["DISPATCHCTL_BIN"],
                     ["dispatchctl", "--server", self.fx.address, "watch", job_id])
        out = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child has exited and the terminal is closed
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        text = out.decode()
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, text)
        self.assertIn("QUEUED for 1s ...", text)
        self.assertIn(" SUCCEEDED attempt=1 worker=py-w", text)
        self.assertTrue(text.endswith("\r\x1b[K"), repr(text[-40:]))

    def test_server_reflection_answers_generic_tools(self):
        # What grpcurl and similar tools ask: the services, then the descriptors of one.
        from google.protobuf import descriptor_pb2
        import server_reflection_pb2 as rpb
        import server_reflection_pb2_grpc as rpb_grpc
        with grpc.insecure_channel(self.fx.address) as channel:
            stub = rpb_grpc.ServerReflectionStub(channel)
            answers = list(stub.ServerReflectionInfo(iter([
                rpb.ServerReflectionRequest(list_services=""),
                rpb.ServerReflectionRequest(file_containing_symbol="dispatchd.v1.JobService"),
            ]), timeout=10))
        self.assertEqual(len(answers), 2)
        services = {s.name for s in answers[0].list_services_response.service}
        self.assertLessEqual({"dispatchd.v1.JobService", "dispatchd.v1.WorkerService",
                              "dispatchd.v1.AdminService", "grpc.health.v1.Health"}, services)
        files = {}
        for raw in answers[1].file_descriptor_response.file_descriptor_proto:
            f = descriptor_pb2.FileDescriptorProto.FromString(raw)
            files[f.name] = f
        self.assertIn("dispatchd/v1/job_service.proto", files)
        methods = {m.name for m in files["dispatchd/v1/job_service.proto"].service[0].method}
        self.assertLessEqual({"Submit", "SubmitBatch", "RunSync", "Status", "Cancel", "Watch"},
                             methods)

    def test_unreachable_daemon_is_unavailable(self):
        with dispatchd.Client("127.0.0.1:1", timeout=2) as c:
            with self.assertRaises(dispatchd.DispatchError) as err:
                c.status("x")
        self.assertIn(err.exception.code,
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))


def _in(seconds):
    import datetime
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


if __name__ == "__main__":
    unittest.main()
