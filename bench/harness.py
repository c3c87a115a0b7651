"""Shared bench plumbing: a sidecar subprocess, latency percentiles, the JSON last line."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
STOP_WAIT_S = 120  # the most a stopping sidecar is waited for before it is killed
sys.path.insert(0, str(ROOT))

from sidecar.api import context_service_pb2 as pb  # noqa: E402
from sidecar.api import context_service_pb2_grpc as pb_grpc  # noqa: E402


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": round(pick(0.50), 3), "p99_ms": round(pick(0.99), 3),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


def settle() -> None:
    """Before a served latency measurement, after an in-process set-up: this client as lean as a fresh
    one and no disk backlog, so the figure is the sidecar's. The set-up's objects (a 100k-chunk index
    is ~10^6 of them) are collected or frozen, out of the garbage collector's way: left in, they slowed
    every client call (p50 1.6 -> 2.0 ms measured, back to 1.5 with gc.freeze()); and the files it
    wrote (~450 MB) are flushed, so their write-back does not compete with the calls on 2 cores."""
    import gc

    gc.collect()
    gc.freeze()
    os.sync()


def median_us(fn: Callable[[], object], reps: int, inner: int = 1) -> float:
    """Median microseconds of one call of fn (after one warm-up call), over reps timings of inner calls."""
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples) * 1e6


def time_calls(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def throughput(make_call: Callable[[int], Callable[[], object]], threads: int, seconds: float) -> float:
    """Calls per second with `threads` clients, each with its own call closure."""
    count = [0] * threads
    stop = threading.Event()

    def worker(i: int) -> None:
        call = make_call(i)
        while not stop.is_set():
            call()
            count[i] += 1

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return round(sum(count) / seconds, 1)


def throughput_cpu(make_call: Callable[[int], Callable[[], object]], threads: int, seconds: float,
                   server_pid: int) -> dict[str, float]:
    """throughput() plus the CPU each side spent per call: with every core busy, cores divided by
    the two together is the most calls/s this machine can serve, whatever the concurrency."""
    from tests.adversity.harness import proc_stats  # the soak's /proc reader

    client0, server0 = time.process_time(), proc_stats(server_pid)["cpu_s"]
    rps = throughput(make_call, threads, seconds)
    calls = max(rps * seconds, 1.0)
    client_ms = (time.process_time() - client0) * 1000 / calls
    server_ms = (proc_stats(server_pid)["cpu_s"] - server0) * 1000 / calls
    return {"rps": rps, "client_cpu_ms": round(client_ms, 3), "server_cpu_ms": round(server_ms, 3),
            "cpu_bound_rps": round((os.cpu_count() or 1) * 1000 / (client_ms + server_ms), 1)}


class ServerProcess:
    """`python -m sidecar serve` on a temp DuckDB file and a free port."""

    def __init__(self, extra: list[str] | None = None, command: list[str] | None = None) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.tmp = tempfile.mkdtemp(prefix="sidecar-bench-")
        self.address = f"127.0.0.1:{port}"
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "sidecar", "serve"]), "--db", f"{self.tmp}/bench.duckdb", "--listen", self.address,
             "--log-level", "WARNING", *(extra or [])],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        while True:
            line = self.proc.stdout.readline()
            if "serving on" in line:
                break
            if self.proc.poll() is not None or not line:
                raise RuntimeError("sidecar did not start: " + line)
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ContextServiceStub(self.channel)

    def new_stub(self) -> pb_grpc.ContextServiceStub:
        return pb_grpc.ContextServiceStub(grpc.insecure_channel(self.address))

    def stop(self) -> None:
        """A clean stop (in-flight calls, snapshots and the database's checkpoint: a replayed history on a
        busy machine takes more than a few seconds); killed only when that hangs."""
        self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def one_core() -> str:
    """The CPU a pinned sidecar runs on (`serve --cpus`): the last this process may use."""
    return str(max(os.sched_getaffinity(0)))


def served_build_latency(db: str, request, n: int, configs: dict[str, list[str]], blocks: int = 10,
                         client_cpus: set[int] | None = None) -> dict[str, tuple[object, float, dict[str, float]]]:
    """Per configuration (extra `serve` arguments): (first response, its seconds, percentiles of n more)
    of one BuildContext request, or of a list of them taken in turn (each configuration gets the same
    sequence). Each configuration serves its own copy of the database's folder, all at once, and the
    n calls go in blocks taken in turn (order reversed every round), so a machine whose speed drifts
    from minute to minute (seen here: 2x) weighs on each alike. The first call loads the indexes.
    client_cpus: once the servers run, this process (the calling service) runs on these CPUs only."""
    import itertools
    import shutil

    requests = request if isinstance(request, list) else [request]
    allowed = os.sched_getaffinity(0)

    folder = Path(db).parent
    servers: dict[str, ServerProcess] = {}
    copies: list[Path] = []
    out: dict[str, tuple[object, float, dict[str, float]]] = {}
    samples: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for i, (name, extra) in enumerate(configs.items()):
            copy = folder
            if i:
                copy = Path(shutil.copytree(folder, tempfile.mkdtemp(prefix="sidecar-bench-") + "/db"))
                copies.append(copy.parent)
            servers[name] = ServerProcess(extra=["--db", str(copy / Path(db).name), *extra])
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        firsts, turns = {}, {}
        for name, server in servers.items():
            t = time.perf_counter()
            firsts[name] = (server.stub.BuildContext(requests[0], timeout=300), time.perf_counter() - t)
            turns[name] = itertools.cycle(requests)
        order = list(servers.items())
        for block in range(blocks):
            for name, server in (order if block % 2 == 0 else order[::-1]):
                samples[name] += time_calls(lambda s=server, q=turns[name]: s.stub.BuildContext(next(q)),
                                            n // blocks, warmup=50 if block == 0 else 10)
        for name in configs:
            out[name] = (*firsts[name], percentiles(samples[name]))
    finally:
        if client_cpus:
            os.sched_setaffinity(0, allowed)
        for server in servers.values():
            server.stop()
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    return out


# Sections recalled items reach a prompt in: this call's, and the session's kept recall (cache-aware layout).
RECALLED_KINDS = (pb.SECTION_KIND_MEMORIES, pb.SECTION_KIND_KNOWLEDGE, pb.SECTION_KIND_SESSION_RECALL)


def emit(figures: dict) -> None:
    """Every bench ends with its figures as one JSON object on the last line."""
    print(json.dumps(figures, sort_keys=True))
