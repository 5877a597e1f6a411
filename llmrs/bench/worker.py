"""One client process: sends its share of the requests at their arrival times, under its share of the cap.

Why processes: one asyncio process parsing SSE tops out near 8-9k chunks/s, so a single client under-reports a
fast server. The runner splits the workload round-robin over N workers; each gets cap/N in-flight slots, so the
total in flight never exceeds the cap. Workers report progress every 0.2 s (requests done, and the tokens streamed
so far, those of requests still in flight included) and send all their results at the end (or when the runner sets
`stop`: an interrupt), together with their own CPU time so a saturated client is visible. Interrupt signals are
the runner's to handle (a worker ignores them: a closed terminal's SIGHUP reaches the whole process group), and a
worker whose runner is gone (killed) exits at once instead of streaming on.

A multi-turn conversation (specs sharing `conversation` >= 0; the runner keeps each in one worker) starts at its
first turn's offset and holds one of the worker's slots until its last turn: each turn is sent `think_time` seconds
after the previous answer ended, with the history so far (each earlier user message and the server's actual reply)
in front of its own user message. A turn that fails ends its conversation: the turns after it are failures
("skipped: ..."), never sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies

import httpx

from llmrs import envs
from llmrs.bench import http1
from llmrs.bench.client import ClientConfig, build_body, send_request
from llmrs.bench.metrics import output_tokens
from llmrs.bench.records import RequestResult, RequestSpec

PROGRESS_EVERY_S = 0.2
MAX_WARM = 256


@dataclass(slots=True)
class WorkerJob:
    """Everything one worker runs: its requests, their send offsets (s after t0), its in-flight cap."""

    worker: int
    specs: list[RequestSpec]
    offsets: list[float]
    cap: int | None  # None: no cap (a multi-turn run: conversations at once)
    cfg: ClientConfig
    think_time: float = 0.0  # a multi-turn conversation: seconds between an answer's end and the next turn's send


@dataclass(slots=True)
class WorkerStats:
    """Counters shown in the live progress bar."""

    done: int = 0
    failed: int = 0
    inflight: int = 0
    tokens: int = 0  # output tokens: finished requests' (usage, else content chunks) + those streaming's chunks so far
    peak_inflight: int = 0


PROXY_SCHEMES = ("http", "all")  # urllib.request.getproxies() keys of http_proxy / all_proxy (either case)


def _local(base_url: str) -> bool:
    """Whether base_url names this machine (no proxy applies: httpx gets trust_env=False)."""
    return urlsplit(base_url).hostname in ("127.0.0.1", "localhost", "::1")


def client_kind(base_url: str) -> str:
    """Which HTTP client the workers use: "http1" (llmrs.bench.http1: plain http, ~1 ms less client time a request
    than httpx) unless the URL is https, a proxy is set in the environment for a host that is not local (httpx
    honours it), or LLMRS_BENCH_HTTPX is set to a true value; then "httpx"."""
    proxied = not _local(base_url) and any(getproxies().get(k) for k in PROXY_SCHEMES)
    forced = envs.LLMRS_BENCH_HTTPX
    return "http1" if urlsplit(base_url).scheme == "http" and not proxied and not forced else "httpx"


def make_client(base_url: str, n: int, timeout: float) -> Any:
    """The workers' client for `base_url` (client_kind), for up to n requests in flight."""
    if client_kind(base_url) == "http1":
        return http1.StreamClient(base_url)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout), trust_env=not _local(base_url))


async def _warm_connections(client: Any, base_url: str, k: int) -> None:
    """Opens up to k keep-alive connections (GET /health) before the start signal.

    NOTE: without this the first wave of requests pays TCP setup and the client's first-use code paths (httpx:
    ~5-10 ms on a small box) inside its TTFT; a long-running server sees warm connections, and so does the measurement.
    Any answer (even 404) leaves a usable connection; errors are ignored (requests will report them).
    """
    url = base_url.rstrip("/") + "/health"

    async def one() -> None:
        try:
            await client.get(url, timeout=5.0)
        except (httpx.HTTPError, http1.HTTPError, TimeoutError):
            pass

    await asyncio.gather(*(one() for _ in range(max(1, k))))


INTERRUPTS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


def worker_main(job: WorkerJob, queue, go, stop, t0) -> None:
    """Process entry point. Messages on `queue`: ("ready", w), ("progress", w, stats), ("final", w, results, cpu, wall)."""
    for s in INTERRUPTS:  # the runner handles them and sets `stop`
        signal.signal(s, signal.SIG_IGN)
    asyncio.run(_run(job, queue, go, stop, t0))


def _orphaned() -> bool:
    """Whether the runner's process is gone (killed: it can no longer stop this worker or take its results)."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


def _exit_if_orphaned() -> None:
    if _orphaned():
        os._exit(1)


async def _run(job: WorkerJob, queue, go, stop, t0) -> None:
    stats = WorkerStats()
    results: list[RequestResult] = []
    live: dict[int, RequestResult] = {}  # sent, not finished: i -> its result so far
    bodies = [build_body(job.cfg, s) for s in job.specs]
    n = job.cap or max(1, len(job.specs))
    async with make_client(job.cfg.base_url, n, job.cfg.timeout) as client:
        await _warm_connections(client, job.cfg.base_url, min(n, len(job.specs), MAX_WARM))
        queue.put(("ready", job.worker))
        while not go.wait(0.05):
            _exit_if_orphaned()
            await asyncio.sleep(0)
        start = t0.value
        cpu0, wall0 = time.process_time(), time.perf_counter()
        sem = asyncio.Semaphore(job.cap) if job.cap else None

        async def send(i: int, when: float, history: list[dict] | None = None, prior_tokens: int = 0,
                       slot: bool = True) -> RequestResult:
            """Request i sent at `when` (absolute), once a slot is free (`slot` False: the caller holds one).
            `history`: a conversation's earlier messages; `prior_tokens`: their tokens (the input estimate)."""
            spec = job.specs[i]
            delay = when - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if slot and sem is not None:
                await sem.acquire()
            stats.inflight += 1
            stats.peak_inflight = max(stats.peak_inflight, stats.inflight)
            res = live[i] = RequestResult(idx=spec.idx, worker=job.worker, input_len=spec.input_len + prior_tokens,
                                          scheduled=when, conversation=spec.conversation, turn=spec.turn)
            body = build_body(job.cfg, spec, history) if history else bodies[i]
            try:
                await send_request(client, job.cfg, spec, body, res)
            finally:
                stats.inflight -= 1
                if slot and sem is not None:
                    sem.release()
            del live[i]
            results.append(res)
            if res.success:
                stats.done += 1
                stats.tokens += output_tokens(res)
            else:
                stats.failed += 1
            return res

        async def one(i: int) -> None:
            await send(i, start + job.offsets[i])

        async def conversation(turns: list[int]) -> None:
            """One conversation's turns in order; it holds one slot from its first send to its last answer."""
            when = start + job.offsets[turns[0]]
            delay = when - time.perf_counter()
            if delay > 0:  # (its slot is taken at its start time, not before)
                await asyncio.sleep(delay)
            if sem is not None:
                await sem.acquire()
            history: list[dict] = []
            prior = 0
            try:
                for k, i in enumerate(turns):
                    res = await send(i, when, history, prior, slot=False)
                    if not res.success:
                        for j in turns[k + 1:]:
                            s = job.specs[j]
                            results.append(RequestResult(
                                idx=s.idx, worker=job.worker, input_len=s.input_len, max_tokens=s.output_len,
                                conversation=s.conversation, turn=s.turn,
                                error=f"skipped: turn {res.turn} of this conversation failed"))
                            stats.failed += 1
                        return
                    history += [{"role": "user", "content": job.specs[i].prompt},
                                {"role": "assistant", "content": res.text}]
                    prior = (res.prompt_tokens if res.prompt_tokens is not None else res.input_len) + \
                        output_tokens(res)
                    when = res.end + job.think_time
            finally:
                if sem is not None:
                    sem.release()

        convs: dict[int, list[int]] = {}
        for i, spec in enumerate(job.specs):
            if spec.conversation >= 0:
                convs.setdefault(spec.conversation, []).append(i)
        tasks = [asyncio.create_task(one(i)) for i, spec in enumerate(job.specs) if spec.conversation < 0]
        tasks += [asyncio.create_task(conversation(sorted(t, key=lambda i: job.specs[i].turn)))
                  for t in convs.values()]
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=PROGRESS_EVERY_S)
            _exit_if_orphaned()
            queue.put(("progress", job.worker, replace(stats, tokens=stats.tokens + sum(r.chunks for r in live.values()))))
            if stop.is_set():
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        seen = {r.idx for r in results}
        for res in live.values():  # cut off by the interrupt: kept (with what streamed), neither success nor failure
            res.interrupted, res.error = "in flight", ""
            results.append(res)
            seen.add(res.idx)
        for spec in job.specs:  # never sent: recorded as such, never a failure
            if spec.idx not in seen:
                results.append(RequestResult(idx=spec.idx, worker=job.worker, input_len=spec.input_len,
                                             max_tokens=spec.output_len, interrupted="not sent",
                                             conversation=spec.conversation, turn=spec.turn))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    queue.put(("final", job.worker, results, cpu, wall, stats.peak_inflight))
