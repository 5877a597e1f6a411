"""Runs one load over worker processes and merges their timings.

The runner splits requests round-robin over the workers (request i -> worker i % N; a multi-turn conversation's
turns all go to one worker, conversations round-robin like requests) with their precomputed arrival offsets, splits the concurrency cap, starts them (spawn: clean asyncio state), waits until every worker
has its HTTP client ready, then sets one common start time t0 (perf_counter is one machine-wide clock).
An interrupt (Ctrl-C, or `interrupted()` turning true: the bench's SIGTERM / SIGHUP handler) sets `stop`: workers
cancel what is in flight and send what finished; a second interrupt abandons them.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import contextlib
import queue as queue_mod
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmrs.bench.client import ClientConfig
from llmrs.bench.records import RequestResult, RequestSpec
from llmrs.bench.worker import WorkerJob, WorkerStats, worker_main

START_DELAY_S = 0.05  # margin between setting t0 and the first send
READY_TIMEOUT_S = 120.0


@dataclass(slots=True)
class WorkerCPU:
    """One worker's CPU time over its run; `busy` is the fraction of one core (1.0 = saturated)."""

    worker: int
    cpu_s: float
    wall_s: float

    @property
    def busy(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(slots=True)
class RunOutcome:
    """Merged results of one run, sorted by request index."""

    results: list[RequestResult]
    t0: float
    cpu: list[WorkerCPU] = field(default_factory=list)
    peak_inflight_sum: int = 0  # sum over workers of each worker's own peak (an upper bound on the true peak)
    interrupted: bool = False
    signum: int | None = None  # the signal that interrupted it (SIGINT for a KeyboardInterrupt of unknown origin)


def split_cap(cap: int | None, workers: int) -> list[int | None]:
    """Per-worker in-flight caps summing to `cap` (every worker gets >= 1; callers keep workers <= cap)."""
    if cap is None:
        return [None] * workers
    return [cap // workers + (1 if w < cap % workers else 0) for w in range(workers)]


def plan_workers(n_requests: int, cap: int | None, workers: int) -> int:
    """Workers actually used: never more than requests or than in-flight slots."""
    return max(1, min(workers, n_requests or 1, cap if cap else math.inf))


ProgressFn = Callable[[int, int, int, int, float], None]  # done, failed, inflight, tokens, elapsed


def run_load(
    specs: list[RequestSpec],
    offsets: list[float],
    cfg: ClientConfig,
    *,
    cap: int | None,
    workers: int,
    on_progress: ProgressFn | None = None,
    interrupted: Callable[[], int | None] | None = None,
    think_time: float = 0.0,
) -> RunOutcome:
    """Send `specs` at `offsets` (s after start) with at most `cap` in flight, over `workers` processes.
    `interrupted()`: the signal number of an interrupt to stop at (polled every 0.1 s), else None.
    Multi-turn specs (conversation >= 0): a conversation starts at its first turn's offset, `cap` bounds the
    conversations at once, and each later turn is sent `think_time` s after the answer before it (worker.py)."""
    assert len(specs) == len(offsets)
    units = _units(specs)
    nw = plan_workers(len(units), cap, workers)
    caps = split_cap(cap, nw)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    t0 = ctx.Value("d", 0.0)
    share: list[list[int]] = [[] for _ in range(nw)]
    for u, positions in enumerate(units):
        share[u % nw] += positions
    jobs = [WorkerJob(w, [specs[p] for p in share[w]], [offsets[p] for p in share[w]], caps[w], cfg, think_time)
            for w in range(nw)]
    procs = [ctx.Process(target=worker_main, args=(j, q, go, stop, t0), daemon=True) for j in jobs]
    with _main_module_hidden():
        for p in procs:
            p.start()
    stats: dict[int, WorkerStats] = {}
    finals: dict[int, tuple] = {}
    signum: int | None = None
    strikes: dict[int, int] = {}
    finished = False
    try:
        ready, deadline = 0, time.monotonic() + READY_TIMEOUT_S
        while ready < nw:
            try:
                msg = q.get(timeout=0.1)
            except queue_mod.Empty:
                dead = [p for p in procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"bench worker failed to start (exit code {dead[0].exitcode if dead else 'timeout'})")
                continue
            ready += msg[0] == "ready"
        t0.value = time.perf_counter() + START_DELAY_S
        go.set()
        while len(finals) < nw:
            try:
                if signum is None and interrupted is not None and (sig := interrupted()):
                    signum = sig
                    stop.set()
                try:
                    msg = q.get(timeout=0.1)
                except queue_mod.Empty:
                    _check_alive(procs, finals, jobs, strikes)
                    msg = None
                if msg and msg[0] == "progress":
                    stats[msg[1]] = msg[2]
                elif msg and msg[0] == "final":
                    finals[msg[1]] = msg[2:]
                if on_progress and stats:
                    s = list(stats.values())
                    on_progress(
                        sum(x.done for x in s), sum(x.failed for x in s), sum(x.inflight for x in s),
                        sum(x.tokens for x in s), time.perf_counter() - t0.value,
                    )
            except KeyboardInterrupt as e:
                if signum is not None:
                    raise  # the second interrupt: abandon the workers
                signum = getattr(e, "signum", signal.SIGINT)
                stop.set()
        finished = True
    finally:
        for p in procs:  # (abandoned or never started: they have nothing to send)
            p.join(timeout=5 if finished else 0)
            if p.is_alive():
                p.terminate()
    results = sorted((r for f in finals.values() for r in f[0]), key=lambda r: r.idx)
    cpu = [WorkerCPU(w, f[1], f[2]) for w, f in sorted(finals.items())]
    return RunOutcome(results, t0.value, cpu, sum(f[3] for f in finals.values()), signum is not None,
                      int(signum) if signum is not None else None)


def _units(specs: list[RequestSpec]) -> list[list[int]]:
    """The positions of what one worker must send together: each single request alone, each conversation whole
    (in the order their first request comes)."""
    units: list[list[int]] = []
    conv: dict[int, list[int]] = {}
    for p, s in enumerate(specs):
        if s.conversation < 0:
            units.append([p])
        elif s.conversation in conv:
            conv[s.conversation].append(p)
        else:
            units.append(conv.setdefault(s.conversation, [p]))
    return units


@contextlib.contextmanager
def _main_module_hidden():
    """Spawned workers must not re-run the parent's __main__ (e.g. `python -m llmrs`, whose __main__ has no
    `if __name__ == "__main__"` guard): they need only importable llmrs modules, so the parent's main module is
    hidden from multiprocessing's preparation data while the workers start."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__spec__", "__file__") if hasattr(main, k)}
    try:
        if main is not None:
            main.__spec__ = None
            if "__file__" in saved:
                del main.__file__
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _check_alive(procs, finals: dict, jobs: list[WorkerJob], strikes: dict[int, int]) -> None:
    """A worker that died without its final message: its requests are failures ("worker crashed"), not lost.

    NOTE: a worker may exit right after queueing its final message; only after 1 s of an empty queue is it lost.
    """
    for w, p in enumerate(procs):
        if w in finals or p.is_alive():
            continue
        strikes[w] = strikes.get(w, 0) + 1
        if strikes[w] >= 10:
            now = time.perf_counter()
            rows = [RequestResult(idx=s.idx, worker=w, error=f"client worker crashed (exit {p.exitcode})", start=now, end=now, input_len=s.input_len) for s in jobs[w].specs]
            finals[w] = (rows, 0.0, 0.0, 0)
