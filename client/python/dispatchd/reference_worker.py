"""dispatch-worker.py: the reference dispatchd worker on the Python SDK.

    dispatch-worker.py --server 127.0.0.1:7411 --types echo --slots 2 --exec 'tr a-z A-Z'

The same command line and behaviour as the C++ dispatch-worker: modes --echo (result = payload),
--exec CMD (run `/bin/sh -c CMD` per job), --simulate MIX (sleep a duration drawn from a latency
mix), --sleep-payload (sleep the duration the payload names). SIGTERM/SIGINT drain (running jobs
finish, then exit 0); a second signal exits at once.
"""

import argparse
import logging
import os
import random
import re
import selectors
import signal
import socket
import sys
import threading
import time

from dispatchd.security import Security
from dispatchd.worker import (DEFAULT_MAX_OUTPUT_BYTES, Gpu, JobFailed, MemoryReport, Refused,
                              Worker)

_MAX_STDERR_MESSAGE = 4096
_MAX_STDERR_KEPT = 64 * 1024
_KILL_GRACE = 2.0
_EX_TEMPFAIL = 75

_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|ms|s|m|h)")


def parse_duration(text):
    """Seconds for a duration in the daemon's syntax: `2s`, `250ms`, `1.5s`, `1m30s`, `0`
    (ns, us, ms, s, m, h). None if it is not one."""
    text = text.strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    sign = 1.0
    if text[:1] in "+-" and text:
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if not text:
        return None
    total, pos = 0.0, 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            return None
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


class LatencyMix:
    """Weighted buckets of durations, `P%:RANGE[,P%:RANGE...]` (RANGE: `2s` or `A-B`), as the
    C++ worker's --simulate takes them."""

    def __init__(self, spec):
        self.buckets = []  # (percent, min seconds, max seconds)
        if not spec.strip():
            raise ValueError(f'latency mix "{spec}": empty')
        total = 0.0
        for raw in spec.split(","):
            part = raw.strip()
            if not part:
                raise ValueError(f'latency mix "{spec}": empty bucket')
            rng = part
            percent = 100.0
            if ":" in part:
                pct, rng = part.split(":", 1)
                pct = pct.strip()
                if not pct.endswith("%"):
                    raise ValueError(f'latency mix "{part}": percentage "{pct}" must end in %')
                try:
                    percent = float(pct[:-1])
                except ValueError:
                    percent = float("nan")
                if not 0 < percent <= 100:
                    raise ValueError(f'latency mix "{part}": bad percentage "{pct}" '
                                     "(want 0 < P <= 100)")
            rng = rng.strip()
            dash = rng.find("-", 1) if len(rng) > 1 else -1
            lo_text, hi_text = (rng, rng) if dash < 0 else (rng[:dash], rng[dash + 1:])
            lo, hi = self._bound(part, lo_text), self._bound(part, hi_text)
            if hi < lo:
                raise ValueError(f'latency mix "{part}": range min {lo_text.strip()} > max '
                                 f"{hi_text.strip()}")
            self.buckets.append((percent, lo, hi))
            total += percent
        if abs(total - 100) > 1e-6:
            raise ValueError(f'latency mix "{spec}": percentages add up to {total:g}, not 100')

    @staticmethod
    def _bound(part, text):
        seconds = parse_duration(text) if text.strip() else None
        if seconds is None:
            raise ValueError(f'latency mix "{part}": bad duration "{text.strip()}"')
        if seconds < 0:
            raise ValueError(f'latency mix "{part}": negative duration "{text.strip()}"')
        return seconds

    def sample(self, rng):
        pick = rng.uniform(0, 100)
        acc = 0.0
        bucket = self.buckets[-1]
        for b in self.buckets:
            acc += b[0]
            if pick < acc:
                bucket = b
                break
        return bucket[1] if bucket[2] <= bucket[1] else rng.uniform(bucket[1], bucket[2])


class Journal:
    """Appends `start job=J attempt=N ms=T` / `end job=J attempt=N ok=0|1 ms=T` lines, flushed
    at once. Thread-safe."""

    def __init__(self, path):
        self._file = open(path, "a")
        self._lock = threading.Lock()

    def _write(self, line):
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def start(self, job):
        self._write(f"start job={job.job_id} attempt={job.attempt} ms={int(time.time() * 1000)}\n")

    def end(self, job, ok):
        self._write(f"end job={job.job_id} attempt={job.attempt} ok={int(ok)} "
                    f"ms={int(time.time() * 1000)}\n")


class StartLog:
    """`JOB_ID ATTEMPT UNIX_MICROS` when a job's handler starts; buffered, written at exit."""

    def __init__(self, path):
        self._file = open(path, "a", buffering=1 << 16)
        self._lock = threading.Lock()

    def record(self, job):
        line = f"{job.job_id} {job.attempt} {time.time_ns() // 1000}\n"
        with self._lock:
            self._file.write(line)

    def close(self):
        with self._lock:
            self._file.close()


def run_exec(command, max_output, job):
    """Runs `/bin/sh -c command` with the payload on stdin; stdout is the result. A non-zero exit
    fails the job with stderr as its message (exit 75: retryable); cancellation sends SIGTERM to
    the command's process group, then SIGKILL after 2 s."""
    env = dict(os.environ, DISPATCHD_JOB_ID=job.job_id, DISPATCHD_ATTEMPT=str(job.attempt),
               DISPATCHD_JOB_TYPE=job.type, DISPATCHD_RESOURCE_ID=job.resource_id,
               DISPATCHD_MODEL=job.model)
    pipes = [os.pipe() for _ in range(3)]  # close-on-exec; the child gets dup2'd copies
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = pipes
    try:
        # Its own process group, so that a cancel reaches grandchildren; the signals this
        # process blocks (for its signal thread) unblocked and at their defaults.
        pid = os.posix_spawn(
            "/bin/sh", ["/bin/sh", "-c", command], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, err_w, 2)],
            setpgroup=0, setsigmask=(),
            setsigdef=(signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    except OSError as e:
        for fd in (in_w, out_r, err_r):
            os.close(fd)
        raise JobFailed(f"spawn /bin/sh failed: {e.strerror}", retryable=True) from e
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    payload = memoryview(job.payload)
    sel = selectors.DefaultSelector()
    for fd in (out_r, err_r):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    open_fds = {out_r, err_r}
    if payload:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE)
        open_fds.add(in_w)
    else:
        os.close(in_w)

    def close(fd):
        if fd in open_fds:
            sel.unregister(fd)
            os.close(fd)
            open_fds.discard(fd)

    out, err = bytearray(), bytearray()
    too_large = cancelled = killed = False
    exited_at = term_at = None
    status = None
    written = 0
    while True:
        now = time.monotonic()
        if not cancelled and job.cancelled:
            cancelled, term_at = True, now
            _kill_group(pid, signal.SIGTERM)
        if cancelled and not killed and now - term_at >= _KILL_GRACE:
            killed = True
            _kill_group(pid, signal.SIGKILL)
        if status is None:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                status = os.waitstatus_to_exitcode(wstatus)
                exited_at = now
                close(in_w)
        if status is not None and (not (open_fds - {in_w}) or now - exited_at > 0.2):
            break  # a grandchild may keep the pipes open after the shell exits: stop soon after
        if not open_fds:
            time.sleep(0.01)
            continue
        for key, _ in sel.select(0.05):
            fd = key.fd
            if fd == in_w:
                try:
                    written += os.write(fd, payload[written:])
                    if written == len(payload):
                        close(fd)
                except BlockingIOError:
                    pass
                except OSError:  # the command stopped reading (EPIPE)
                    close(fd)
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                close(fd)
            elif fd == out_r:
                out += chunk
                if len(out) > max_output:
                    too_large = True
                    out.clear()
            else:
                err += chunk
                del err[:-_MAX_STDERR_KEPT]
    for fd in list(open_fds):
        close(fd)
    sel.close()

    message = err.decode(errors="replace").strip()[-_MAX_STDERR_MESSAGE:]
    sep = " " if message else ""
    if cancelled:
        raise JobFailed(f"cancelled: {job.cancel_reason}")
    if status < 0:
        raise JobFailed(f"{message}{sep}(killed by signal {-status})")
    if status != 0:
        raise JobFailed(f"{message}{sep}(exit status {status})", retryable=status == _EX_TEMPFAIL)
    if too_large:
        raise JobFailed(f"output exceeds {max_output} bytes")
    return bytes(out)


def _kill_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


class Simulator:
    """Simulated jobs: a latency draw per job, plus a model-load delay when the model changes."""

    def __init__(self, mix, model_load_delay, seed):
        self._mix = mix
        self._model_load_delay = model_load_delay
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loaded = ""
        self.worker = None

    def run(self, job):
        with self._lock:
            sleep = self._mix.sample(self._rng)
            load = False
            if job.model and job.model != self._loaded:
                self._loaded = job.model
                load = self._model_load_delay > 0
        if job.model and self.worker is not None:
            self.worker.set_models_resident([job.model])
        if load and job.wait_for_cancellation(self._model_load_delay):
            raise JobFailed(f"cancelled: {job.cancel_reason}")
        if job.wait_for_cancellation(sleep):
            raise JobFailed(f"cancelled: {job.cancel_reason}")
        return f"simulated {sleep:g}s"


def run_sleep_payload(job):
    """--sleep-payload: the payload names the job's duration (`2.5s`, `1500ms`)."""
    text = job.payload.decode(errors="replace").strip()
    seconds = parse_duration(text)
    if seconds is None or seconds < 0:
        raise JobFailed(f'--sleep-payload: payload "{text[:64]}" is not a duration')
    if job.wait_for_cancellation(seconds):
        raise JobFailed(f"cancelled: {job.cancel_reason}")
    return f"slept {seconds:g}s"


def _memory_file_probe(path):
    def probe():
        try:
            with open(path) as f:
                fields = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            fields = []
        fields += [0] * (2 - len(fields))
        return MemoryReport(fields[0], fields[1], tuple(fields[2:3]))
    return probe


def _parser():
    p = argparse.ArgumentParser(
        prog="dispatch-worker.py",
        description="The reference dispatchd worker on the Python SDK (one WorkerService stream).",
        epilog="Exit status: 0 after a drain (SIGTERM/SIGINT, or the daemon's Drain); 1 on a "
               "startup failure; 2 on a usage error; 128+signal on a second signal.\n"
               "Example: dispatch-worker.py --server 127.0.0.1:7411 --types echo --slots 2 "
               "--exec 'tr a-z A-Z'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.environ.get("DISPATCHD_SERVER") or "127.0.0.1:7411",
                   help="daemon address host:port, or several comma-separated (a standby sends "
                        "the worker to the leader) (env DISPATCHD_SERVER; default %(default)s)")
    p.add_argument("--id", default=f"{socket.gethostname()}:{os.getpid()}",
                   help="worker id, unique in the fleet (default hostname:pid)")
    p.add_argument("--types", required=True, help="job types served, comma-separated")
    env = os.environ.get
    p.add_argument("--tls-ca", default=env("DISPATCHD_TLS_CA"),
                   help="PEM file of the CA that signed the daemon's certificate; set: connect "
                        "with TLS (env DISPATCHD_TLS_CA)")
    p.add_argument("--tls-cert", default=env("DISPATCHD_TLS_CERT"),
                   help="PEM file of this worker's certificate, for mutual TLS (with --tls-key) "
                        "(env DISPATCHD_TLS_CERT)")
    p.add_argument("--tls-key", default=env("DISPATCHD_TLS_KEY"),
                   help="PEM file of the private key of --tls-cert (env DISPATCHD_TLS_KEY)")
    p.add_argument("--token-file", default=env("DISPATCHD_TOKEN_FILE"),
                   help="file whose first line is the bearer token to present "
                        "(env DISPATCHD_TOKEN_FILE)")
    p.add_argument("--slots", type=int, default=1, help="slots advertised to the daemon")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="jobs run at once; more are refused RESOURCE_EXHAUSTED (default: --slots)")
    p.add_argument("--labels", default="", help="placement labels k=v,k2=v2")
    p.add_argument("--memory-file",
                   help="report memory use from this file instead of /proc/meminfo and NVML: one "
                        "line `RAM_USED RAM_TOTAL [GPU_USED]` in bytes (GPU_USED: of the first "
                        "GPU), re-read at each heartbeat")
    p.add_argument("--gpu-memory-gb", type=float, default=0,
                   help="report one GPU with this much memory (GB) instead of the GPUs NVML reads")
    p.add_argument("--no-nvml", action="store_true",
                   help="do not read GPUs from NVML (libnvidia-ml.so.1, or env "
                        "DISPATCHD_NVML_LIBRARY): report none unless --gpu-memory-gb names one "
                        "(default: the GPUs NVML lists that CUDA_VISIBLE_DEVICES leaves visible)")
    p.add_argument("--journal", help="append `start job=J attempt=N ms=T` / `end job=J attempt=N "
                                     "ok=0|1 ms=T` lines")
    p.add_argument("--start-log", help="append `JOB_ID ATTEMPT UNIX_MICROS` when a job's handler "
                                       "starts (buffered, written out at exit)")
    p.add_argument("--log-level", default="info",
                   choices=["trace", "debug", "info", "warn", "error", "critical", "off"])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--echo", action="store_true", help="result = payload (the default mode)")
    mode.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                      help="run `/bin/sh -c CMD` per job: payload on stdin, stdout is the result; "
                           "non-zero exit fails with stderr as the message (exit 75 = retryable)")
    mode.add_argument("--simulate", metavar="MIX",
                      help="sleep a duration drawn from a latency mix, "
                           "e.g. '95%%:1s-5s,5%%:20s-40s'")
    mode.add_argument("--sleep-payload", action="store_true",
                      help="sleep the duration the job's payload names, e.g. '2.5s'")
    p.add_argument("--model-load-delay", default="0s",
                   help="--simulate: extra delay when a job's model differs from the last loaded "
                        "one (default %(default)s)")
    p.add_argument("--seed", type=int, help="--simulate: random seed (default: random)")
    return p


_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
           "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
           "off": logging.CRITICAL + 10}


def main(argv=None):
    # Signals are taken by a dedicated thread: block them before any thread starts.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    p = _parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=_LEVELS[args.log_level], stream=sys.stderr,
                        format="[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s")
    log = logging.getLogger("dispatchd.worker")

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    if not types:
        p.error("--types: at least one type is required")
    if args.slots < 1:
        p.error(f"--slots: must be >= 1, got {args.slots}")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        p.error(f"--max-concurrent: must be >= 1, got {args.max_concurrent}")
    if args.gpu_memory_gb < 0:
        p.error("--gpu-memory-gb: must be >= 0")
    labels = {}
    for kv in (x for x in args.labels.split(",") if x.strip()):
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            p.error(f'--labels: "{kv}" is not k=v')
        labels[k.strip()] = v.strip()
    model_load_delay = parse_duration(args.model_load_delay)
    if model_load_delay is None or model_load_delay < 0:
        p.error(f'--model-load-delay: invalid duration "{args.model_load_delay}"')
    if args.exec_cmd == "":
        p.error("--exec: empty command")
    journal = start_log = None
    for flag, path, kind in (("--journal", args.journal, Journal),
                             ("--start-log", args.start_log, StartLog)):
        if not path:
            continue
        try:
            opened = kind(path)
        except OSError as e:
            p.error(f'{flag}: cannot open "{path}": {e.strerror}')
        if kind is Journal:
            journal = opened
        else:
            start_log = opened

    simulator = None
    if args.sleep_payload:
        run = run_sleep_payload
    elif args.exec_cmd is not None:
        def run(job):
            return run_exec(args.exec_cmd, DEFAULT_MAX_OUTPUT_BYTES, job)
    elif args.simulate is not None:
        try:
            mix = LatencyMix(args.simulate)
        except ValueError as e:
            p.error(f"--simulate: {e}")
        simulator = Simulator(mix, model_load_delay,
                              args.seed if args.seed is not None else random.getrandbits(64))
        run = simulator.run
    else:
        def run(job):
            return job.payload

    def handler(job):
        if start_log is not None:
            start_log.record(job)
        if journal is not None:
            journal.start(job)
        ok = False
        try:
            result = run(job)
            ok = True
            return result
        finally:
            if journal is not None:
                journal.end(job, ok)

    try:
        worker = Worker(args.server, worker_id=args.id, types=types, handler=handler,
                        slots=args.slots, max_concurrent=args.max_concurrent or 0, labels=labels,
                        gpus=([Gpu("0", int(args.gpu_memory_gb * 1e9))] if args.gpu_memory_gb
                              else []),
                        memory_probe=_memory_file_probe(args.memory_file) if args.memory_file
                        else None,
                        nvml=not args.no_nvml,
                        security=Security(args.tls_ca, args.tls_cert, args.tls_key,
                                          args.token_file))
    except ValueError as e:
        p.error(str(e))
    if simulator is not None:
        simulator.worker = worker

    def on_signals():
        count = 0
        while True:
            sig = signal.sigwait({signal.SIGTERM, signal.SIGINT})
            count += 1
            if count == 1:
                log.info("signal=%d: draining (send again to exit at once)", sig)
                worker.drain()
            else:
                log.warning("signal=%d: exiting now", sig)
                if start_log is not None:
                    start_log.close()
                sys.stderr.flush()
                os._exit(128 + sig)

    threading.Thread(target=on_signals, name="signals", daemon=True).start()
    try:
        worker.run()
    except Refused:
        return 1  # logged by the worker
    finally:
        worker.close()
        if start_log is not None:
            start_log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
