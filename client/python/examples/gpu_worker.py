#!/usr/bin/python3
"""An example GPU worker: loads its model once, then serves many jobs with it.

    gpu_worker.py --server 127.0.0.1:7411 --type embed.text --model toy-embed --slots 4

The "model" is a toy text embedder (hashed character trigrams through a fixed random
projection), small enough to run anywhere; a real worker loads its weights onto the GPU at the
same place. What matters is the shape:

- the model is loaded once, before the worker connects, and named in `models_resident`, so the
  daemon's affinity sends this model's jobs here rather than to a worker that would have to load
  it;
- `--gpu-memory-gb` reports the GPU, so the daemon places only models whose `vram_gb` fit;
- each job runs on an SDK thread against the shared model (inference is read-only), and checks
  `job.cancelled` between steps of long work;
- SIGTERM drains: running jobs finish and their results are delivered, then it exits 0.

A job's payload is UTF-8 text; its output is JSON: {"model", "load_id", "dim", "embedding"}.
`load_id` names the load that served it: every job of one worker process carries the same one.
Runs wherever the dispatchd package is importable: installed (`pip install ./client/python`), or
the build tree's copy on PYTHONPATH (PYTHONPATH=build/client/python).
"""

import argparse
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
import zlib

import dispatchd

log = logging.getLogger("gpu_worker")


class ToyEmbedder:
    """A deterministic text embedder: hashed character trigrams, projected to `dim` numbers."""

    BUCKETS = 4096

    def __init__(self, name, dim, load_seconds):
        started = time.monotonic()
        self.name = name
        self.dim = dim
        self.load_id = uuid.uuid4().hex[:12]
        rng = random.Random(name)  # the same "weights" for a model name, in every process
        self.weights = [[rng.gauss(0, 1) for _ in range(dim)] for _ in range(self.BUCKETS)]
        time.sleep(max(0.0, load_seconds - (time.monotonic() - started)))  # a real load's time
        self.load_seconds = time.monotonic() - started

    def embed(self, text, job):
        vec = [0.0] * self.dim
        padded = f"  {text} "
        for i in range(len(padded) - 2):
            if i % 1024 == 0 and job.cancelled:
                raise dispatchd.JobFailed(f"cancelled: {job.cancel_reason}")
            row = self.weights[zlib.crc32(padded[i:i + 3].encode()) % self.BUCKETS]
            for d in range(self.dim):
                vec[d] += row[d]
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        return [round(x / norm, 6) for x in vec]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: gpu_worker.py --server 127.0.0.1:7411 "
                                       "--type embed.text --model toy-embed --slots 4")
    p.add_argument("--server", default=os.environ.get("DISPATCHD_SERVER") or "127.0.0.1:7411")
    p.add_argument("--id", default=None, help="worker id (default hostname:pid)")
    p.add_argument("--type", default="embed.text", help="the job type served")
    p.add_argument("--model", default="toy-embed", help="the model loaded (the type's `model`)")
    p.add_argument("--dim", type=int, default=16, help="embedding size")
    p.add_argument("--slots", type=int, default=4, help="jobs run at once")
    p.add_argument("--gpu-memory-gb", type=float, default=0,
                   help="the GPU's memory, reported to the daemon (default: none reported)")
    p.add_argument("--load-seconds", type=float, default=1.0,
                   help="how long the model load takes (default %(default)s)")
    args = p.parse_args()
    # SIGTERM/SIGINT are taken by a thread of their own; block them before any thread starts.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s")

    model = ToyEmbedder(args.model, args.dim, args.load_seconds)
    log.info("loaded model=%s load_id=%s in %.2fs", model.name, model.load_id, model.load_seconds)

    def handle(job):
        if job.model and job.model != model.name:
            raise dispatchd.JobFailed(f'this worker serves model "{model.name}", not '
                                      f'"{job.model}"')
        try:
            text = job.payload.decode()
        except UnicodeDecodeError as e:
            raise dispatchd.JobFailed(f"payload is not UTF-8: {e}") from None
        return json.dumps({"model": model.name, "load_id": model.load_id, "dim": model.dim,
                           "embedding": model.embed(text, job)})

    worker = dispatchd.Worker(
        args.server, worker_id=args.id or f"{os.uname().nodename}:{os.getpid()}",
        types=[args.type], slots=args.slots, handler=handle, models_resident=[model.name],
        gpus=[dispatchd.Gpu("0", int(args.gpu_memory_gb * 1e9))] if args.gpu_memory_gb else [])

    def on_signals():
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        log.info("draining (send again to exit at once)")
        worker.drain()
        sig = signal.sigwait({signal.SIGTERM, signal.SIGINT})
        os._exit(128 + sig)

    threading.Thread(target=on_signals, daemon=True).start()
    with worker:
        worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
