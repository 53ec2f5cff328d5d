#!/usr/bin/python3
"""An example asyncio worker: many jobs at once in one event loop, as an inference server runs.

    async_worker.py --server 127.0.0.1:7411 --type llm.generate --slots 16

The "model" is a toy text generator whose each step awaits (where a real server awaits its
engine, e.g. an async LLM engine's stream of tokens); the shape is what matters:

- handlers are `async def` coroutines, up to --slots of them at once in one loop, and the worker
  refuses more (RESOURCE_EXHAUSTED) whatever the daemon believes;
- a handler checks `job.cancelled` between steps and stops early with JobFailed;
- SIGTERM/SIGINT drain through the loop's signal handlers: running jobs finish and their results
  are delivered, then run() returns and the process exits 0; a second signal exits at once.

A job's payload is a UTF-8 prompt; its output is the prompt reversed, one "token" a step.
Runs wherever the dispatchd package is importable: installed (`pip install ./client/python`), or
the build tree's copy on PYTHONPATH (PYTHONPATH=build/client/python).
"""

import argparse
import asyncio
import logging
import os
import signal
import sys

import dispatchd

log = logging.getLogger("async_worker")


class ToyEngine:
    """Generates text a token at a time, yielding to the loop between tokens."""

    def __init__(self, step_seconds):
        self.step_seconds = step_seconds

    async def generate(self, prompt):
        for token in reversed(prompt):
            await asyncio.sleep(self.step_seconds)
            yield token


async def serve(args):
    engine = ToyEngine(args.step_seconds)

    async def generate(job):
        try:
            prompt = job.payload.decode()
        except UnicodeDecodeError as e:
            raise dispatchd.JobFailed(f"payload is not UTF-8: {e}") from None
        out = []
        async for token in engine.generate(prompt):
            if job.cancelled:
                raise dispatchd.JobFailed(f"cancelled: {job.cancel_reason}")
            out.append(token)
        return "".join(out)

    worker = dispatchd.AsyncWorker(
        args.server, worker_id=args.id or f"{os.uname().nodename}:{os.getpid()}",
        types=[args.type], slots=args.slots, handler=generate)

    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(sig):
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("draining (send again to exit at once)")
            worker.drain()
        else:
            os._exit(128 + sig)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    async with worker:
        await worker.run()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: async_worker.py --server 127.0.0.1:7411 "
                                       "--type llm.generate --slots 16")
    p.add_argument("--server", default=os.environ.get("DISPATCHD_SERVER") or "127.0.0.1:7411")
    p.add_argument("--id", default=None, help="worker id (default hostname:pid)")
    p.add_argument("--type", default="llm.generate", help="the job type served")
    p.add_argument("--slots", type=int, default=16, help="jobs run at once")
    p.add_argument("--step-seconds", type=float, default=0.01,
                   help="how long each token takes (default %(default)s)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
