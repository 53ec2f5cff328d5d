"""Python SDK for dispatchd, the job-dispatch daemon for GPU fleets.

    import dispatchd
    client = dispatchd.Client("127.0.0.1:7411")
    job_id = client.submit("embed.text", b"a document")
    job = client.run("echo", b"hello", wait=30)       # waits for the job to end
    print(dispatchd.state_name(job.state), job.result)

    def embed(job):                       # a worker: runs each job on a thread of its own
        return model.embed(job.payload)   # the output (bytes or str); raise JobFailed to fail
    dispatchd.Worker("127.0.0.1:7411", worker_id="gpu-1", types=["llm.embed"], slots=2,
                     handler=embed).run()

The same for asyncio (grpc.aio), with coroutine handlers: dispatchd.AsyncClient and
dispatchd.AsyncWorker (dispatchd.aio).

Install it with `pip install ./client/python` (the build generates dispatchd.v1 from proto/ with
protoc and grpc_python_plugin), or use the build tree's copy (`build/client/python` on
PYTHONPATH). It needs Debian's python3-grpcio and python3-protobuf and nothing else.
"""

from dispatchd.client import (  # noqa: F401
    Client,
    DispatchError,
    TERMINAL_STATES,
    job_spec,
    state_name,
)
from dispatchd.security import Security  # noqa: F401
from dispatchd.worker import (  # noqa: F401
    Gpu,
    Job,
    JobFailed,
    MemoryReport,
    Refused,
    Worker,
)
from dispatchd.aio import AsyncClient, AsyncJob, AsyncWorker  # noqa: F401
from dispatchd.v1 import job_pb2  # noqa: F401  (Job, JobSpec, JobState)

__all__ = ["Client", "DispatchError", "TERMINAL_STATES", "job_spec", "state_name", "Gpu", "Job",
           "JobFailed", "MemoryReport", "Refused", "Security", "Worker", "AsyncClient",
           "AsyncJob", "AsyncWorker", "job_pb2"]
